//! Membership inference on diffusers checkpoints: the loss, SecMI and PIA attacks of
//! [`super::mia`] through the batched [`crate::models::eps::EpsPredictor`] interface, on an
//! image data set and split, with the same metrics and report as for dpaudit's own checkpoints:
//! the one-run audit on the canaries of a folder `train --unet --canaries m` wrote, and shards
//! (`mia --shard i/n`, [`score_shard`]) that `merge` reassembles into one run ([`assemble`]).

use std::path::Path;

use candle_core::Tensor;
use indicatif::ProgressBar;

use super::mia::{self, AttackKind, Target};
use super::pipeline::{evaluate_scores, AuditKind, Basis, Evaluated, MiaPlan, MiaReport, TargetInfo};
use super::scores::{self, ScoreRecord, ScoreSet};
use super::shard_spec::ShardSpec;
use crate::error::{Error, Result};
use crate::models::canary::Canaries;
use crate::models::data::indices_sha256;
use crate::models::diffusers::{DiffusersCheckpoint, DiffusersDenoiser};
use crate::models::images::ImageSet;
use crate::models::SplitManifest;

/// `training.json` beside a checkpoint (written by scripts/train_mnist_ddpm.py): what the model
/// was trained on, checked against the split.
#[derive(Debug, Clone, serde::Deserialize)]
struct TrainingRecord {
    #[serde(default)]
    members_sha256: Option<String>,
    #[serde(default)]
    steps: Option<u64>,
    #[serde(default)]
    rows: Option<usize>,
    #[serde(default)]
    command: Option<String>,
}

impl super::denoiser::Denoiser for DiffusersDenoiser<'_> {
    fn dim(&self) -> usize {
        crate::models::eps::EpsPredictor::dim(self)
    }
    fn alpha_bars(&self) -> &[f64] {
        &self.schedule.alpha_bars
    }
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        crate::models::eps::EpsPredictor::predict_eps(self, x, t)
    }
    fn on_device(&self) -> Option<&dyn super::denoiser::DeviceEps> {
        (!self.device().is_cpu()).then_some(self as &dyn super::denoiser::DeviceEps)
    }
}

impl super::denoiser::DeviceEps for DiffusersDenoiser<'_> {
    fn device(&self) -> &candle_core::Device {
        DiffusersDenoiser::device(self)
    }
    fn predict_eps_tensor(&self, x: &candle_core::Tensor, t: usize) -> Result<candle_core::Tensor> {
        DiffusersDenoiser::predict_eps_tensor(self, x, t)
    }
    // Through the CUDA forward's kernels where the model has them (one launch each, none of
    // candle's modules), else candle's operations.
    fn noisy_tensor(&self, x0: &Tensor, eps: &Tensor, abar: f64) -> Result<Tensor> {
        let (sa, sb) = super::denoiser::noisy_factors(abar);
        match self.model().fused_noisy(x0, eps, sa, sb)? {
            Some(t) => Ok(t),
            None => super::denoiser::candle_noisy(x0, eps, abar),
        }
    }
    fn ddim_tensor(&self, x: &Tensor, eps: &Tensor, abar_s: f64, abar_t: f64) -> Result<Tensor> {
        let c = super::denoiser::ddim_coefficients(abar_s, abar_t);
        match self.model().fused_ddim(x, eps, c)? {
            Some(t) => Ok(t),
            None => super::denoiser::candle_ddim(x, eps, abar_s, abar_t),
        }
    }
    fn row_lp_tensor(&self, a: &Tensor, b: &Tensor, p: f64) -> Result<Vec<f64>> {
        match self.model().fused_row_lp(a, b, p)? {
            Some(v) => Ok(v),
            None => super::denoiser::candle_row_lp(a, b, p),
        }
    }
}

/// The records a diffusers run attacks, in the unsharded run's order: the split's members, then
/// its non-members (each list cut to `max_examples`), then (one-run audits) the folder's canaries.
#[derive(Debug, Clone)]
pub struct AttackedRows {
    /// Data rows of the members attacked.
    pub members: Vec<usize>,
    /// Data rows of the non-members attacked.
    pub nonmembers: Vec<usize>,
    /// The canaries (with `--audit one-run`).
    pub canaries: Option<Canaries>,
    training: Option<TrainingRecord>,
    /// What `--max-examples` drew, for the report (None: every row).
    pub subset: Option<String>,
}

impl AttackedRows {
    /// The split rows (members then non-members) by position.
    pub fn split_rows(&self) -> Vec<usize> {
        self.members.iter().chain(&self.nonmembers).copied().collect()
    }

    /// Checks that `records` at `positions` are exactly the records of one unsharded run of
    /// `plan` on these rows: ids, membership labels and canary inclusion bits by position, and
    /// one record per position for every (attack, step).
    pub fn check_records(&self, records: &[ScoreRecord], positions: &[usize], plan: &MiaPlan) -> Result<()> {
        let all = self.split_rows();
        let n_members = self.members.len();
        let bad = |what: String| Err(Error::input(format!("the parts do not match the split: {what}")));
        for (r, &p) in records.iter().zip(positions) {
            match r.set {
                ScoreSet::Split => {
                    let Some(row) = all.get(p) else {
                        return bad(format!(
                            "record {} at position {p} is past the {} rows attacked",
                            r.record_id,
                            all.len()
                        ));
                    };
                    if r.record_id != row.to_string() || r.member != (p < n_members) {
                        return bad(format!(
                            "the record at position {p} is `{}` ({}), the split has row {row} ({}) there",
                            r.record_id,
                            if r.member { "member" } else { "non-member" },
                            if p < n_members { "member" } else { "non-member" }
                        ));
                    }
                }
                ScoreSet::Canary => {
                    let c = p
                        .checked_sub(all.len())
                        .and_then(|j| self.canaries.as_ref().map(|c| (c, j)))
                        .filter(|(c, j)| *j < c.len());
                    match c {
                        Some((c, j)) if r.record_id == c.ids[j] && r.member == c.included[j] => {}
                        _ => {
                            return bad(format!(
                            "canary record {} at position {p} is not the folder's canary there (id or inclusion bit)",
                            r.record_id
                        ))
                        }
                    }
                }
            }
        }
        let n_canaries = self.canaries.as_ref().map_or(0, Canaries::len);
        for &a in &plan.attacks {
            for &t in &plan.timesteps {
                let of = |set: ScoreSet| {
                    records
                        .iter()
                        .filter(|r| r.attack == a && r.t == t && r.set == set)
                        .count()
                };
                let (s, c) = (of(ScoreSet::Split), of(ScoreSet::Canary));
                if s != all.len() || c != n_canaries {
                    return bad(format!(
                        "{} at t = {t} has {s} split and {c} canary records; the run has {} and {n_canaries} (a part is missing or relabelled)",
                        a.as_str(),
                        all.len()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The folder `train --unet` wrote its card in (the UNet folder).
fn card_dir(ck: &DiffusersCheckpoint) -> &Path {
    ck.config_path.parent().unwrap_or(&ck.dir)
}

/// Checks the plan against what a diffusers folder supports, the split against the folder's
/// training record, and lists the rows to attack.
pub fn attacked_rows(
    ck: &DiffusersCheckpoint,
    images: &ImageSet,
    split: &SplitManifest,
    split_path: &Path,
    plan: &MiaPlan,
    max_examples: Option<usize>,
) -> Result<AttackedRows> {
    images.check_split(split, split_path)?;
    if plan.audit == Some(AuditKind::ManyRuns) {
        return Err(Error::field(
            "--audit",
            "many-runs reads a --scores file of independent trials; a diffusers folder supports one-run (train --unet … --canaries m)",
        ));
    }
    let record_path = ck.dir.join("training.json");
    let record_path = if record_path.is_file() {
        record_path
    } else {
        card_dir(ck).join("training.json")
    };
    let training: Option<TrainingRecord> = if record_path.is_file() {
        let text = crate::input::read_to_string(&record_path)?;
        Some(
            serde_json::from_str(&text)
                .map_err(|e| Error::input(format!("not a training record: {e}")).with_file(&record_path))?,
        )
    } else {
        None
    };
    if let Some(h) = training.as_ref().and_then(|r| r.members_sha256.as_ref()) {
        if *h != indices_sha256(&split.members) {
            return Err(Error::input(
                "the split's `members` list does not hash to the training record's members_sha256: this is not the split the model was trained on",
            )
            .with_file(&record_path));
        }
    }
    // Input canaries are scored like records; gradient canaries are audited from the
    // observations the trainer recorded ([`super::pipeline::white_box_audit_of`]), not scored.
    let gradient = crate::models::diffusers_train::UnetCard::load(card_dir(ck))?
        .is_some_and(|c| c.input_canaries().is_none() && c.white_box_canaries().is_some());
    let canaries = match plan.audit {
        Some(AuditKind::OneRun) if !gradient => {
            let dir = card_dir(ck);
            let (c, _) = card_canaries(dir)?;
            if c.dim != images.dim() {
                return Err(Error::input(format!(
                    "the canaries have {} values, the images {}",
                    c.dim,
                    images.dim()
                ))
                .with_file(dir.join(crate::models::diffusers_train::CANARIES)));
            }
            Some(c)
        }
        _ => None,
    };
    let seed = plan.score.seed;
    let members = subset(&split.members, max_examples, seed ^ 0x5ab5_e7a1);
    let nonmembers = subset(&split.nonmembers, max_examples, seed ^ 0x5ab5_e7a2);
    let describe = |name: &str, all: &[usize], got: &[usize]| {
        format!(
            "{} of {} {name} (rows {}..={} of the split's {}..={})",
            got.len(),
            all.len(),
            got.first().copied().unwrap_or(0),
            got.last().copied().unwrap_or(0),
            all.iter().min().copied().unwrap_or(0),
            all.iter().max().copied().unwrap_or(0)
        )
    };
    let cut = members.len() < split.members.len() || nonmembers.len() < split.nonmembers.len();
    let subset = cut.then(|| {
        format!(
            "--max-examples: a seeded random subset (seed {seed}) of each list: {}, {}",
            describe("members", &split.members, &members),
            describe("non-members", &split.nonmembers, &nonmembers)
        )
    });
    Ok(AttackedRows {
        members,
        nonmembers,
        canaries,
        training,
        subset,
    })
}

/// `max` rows of `ix` drawn uniformly at random without replacement (seeded; in the list's
/// order), or all of them. The first `max` of a sorted list would compare members and
/// non-members from different row ranges of the data file, so a cut is always random.
pub fn subset(ix: &[usize], max: Option<usize>, seed: u64) -> Vec<usize> {
    use rand::seq::index::sample;
    use rand::SeedableRng;
    let Some(k) = max.filter(|&k| k < ix.len()) else {
        return ix.to_vec();
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut pick = sample(&mut rng, ix.len(), k).into_vec();
    pick.sort_unstable();
    pick.into_iter().map(|p| ix[p]).collect()
}

/// The canaries of the folder `dir` that `train --unet … --canaries m` wrote (SHA-256 and count
/// checked against its card), with the card's path; refused when the folder has no dpaudit card
/// or was trained without canaries.
fn card_canaries(dir: &Path) -> Result<(Canaries, std::path::PathBuf)> {
    let card = crate::models::diffusers_train::UnetCard::load(dir)?.ok_or_else(|| {
        Error::field(
            "--audit",
            format!(
                "one-run needs the canaries of a folder `train --unet … --canaries m` wrote; {} has no dpaudit card",
                dir.display()
            ),
        )
    })?;
    if card.input_canaries().is_none() && card.white_box_canaries().is_some() {
        return Err(Error::field(
            "--audit",
            format!(
                "{} holds gradient canaries: they are audited from the observations the trainer recorded (`mia --checkpoint {} --audit one-run`), not from a scores file",
                dir.display(),
                dir.display()
            ),
        ));
    }
    Ok((card.canaries(dir)?, dir.join(crate::models::diffusers_train::CARD)))
}

/// [`card_canaries`] of a diffusers checkpoint given as `path` (the UNet folder, a pipeline
/// folder with `unet/`, or its `config.json`): the canaries a one-run audit of it must score.
pub fn folder_canaries(path: &Path) -> Result<(Canaries, std::path::PathBuf)> {
    let udir = crate::models::diffusers::unet_dir(path).unwrap_or_else(|| path.to_path_buf());
    card_canaries(&udir)
}

/// Key of a canary's noise stream: above every data row index (as for 8×8 checkpoints).
const CANARY_KEY_BASE: u64 = 1 << 48;

/// Scores the records of `rows` at positions p with p mod n = i (`shard` i/n; all without one),
/// each with its position in the unsharded run. Every record's attack noise is keyed by its
/// position within its own list (member i and non-member i share a stream, as one run always
/// drew them) or its canary index, and the UNet treats the rows of a batch independently, so a
/// record's score is the same whichever shard computes it.
pub fn score_shard(
    den: &DiffusersDenoiser<'_>,
    images: &ImageSet,
    rows: &AttackedRows,
    plan: &MiaPlan,
    bar: Option<&ProgressBar>,
    shard: Option<ShardSpec>,
) -> Result<Vec<(usize, ScoreRecord)>> {
    let mine = |p: usize| shard.is_none_or(|s| s.owns(p));
    let m = rows.members.len();
    let all = rows.split_rows();
    // (positions, data rows or canary index, keys, ids, labels) of each population.
    let split_pos: Vec<usize> = (0..all.len()).filter(|&p| mine(p)).collect();
    let q_ix: Vec<usize> = split_pos.iter().map(|&p| all[p]).collect();
    let q_rows = images.rows(&q_ix);
    let q_keys: Vec<u64> = split_pos
        .iter()
        .map(|&p| if p < m { p } else { p - m } as u64)
        .collect();
    let ids: Vec<String> = q_ix.iter().map(|i| i.to_string()).collect();
    let labels: Vec<bool> = split_pos.iter().map(|&p| p < m).collect();
    // The empirical attack's denoiser is the sampler's: the empirical denoiser over the rows
    // the model was trained on (the split's members), whichever shard scores.
    let train_rows = if plan.attacks.contains(&AttackKind::Empirical) {
        images.rows(&rows.members)
    } else {
        Vec::new()
    };
    let base = all.len();
    let mut out = Vec::new();
    // Progress counts images: each (attack, step) unit of the bar becomes the images it scores.
    let n_canaries = rows
        .canaries
        .as_ref()
        .map_or(0, |c| (0..c.len()).filter(|&j| mine(base + j)).count());
    let per_unit = |kind: AttackKind| {
        (split_pos.len()
            + if matches!(kind.target(), Target::Checkpoint) {
                n_canaries
            } else {
                0
            }) as u64
    };
    if let Some(b) = bar {
        let extra: u64 =
            plan.attacks.iter().map(|&k| per_unit(k).saturating_sub(1)).sum::<u64>() * plan.timesteps.len() as u64;
        b.inc_length(extra);
    }
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
                let pos: Vec<usize> = (0..c.len()).filter(|&j| mine(base + j)).collect();
                let crow: Vec<f32> = pos
                    .iter()
                    .flat_map(|&j| c.rows[j * c.dim..(j + 1) * c.dim].iter().copied())
                    .collect();
                let keys: Vec<u64> = pos.iter().map(|&j| CANARY_KEY_BASE + j as u64).collect();
                let cids: Vec<String> = pos.iter().map(|&j| c.ids[j].clone()).collect();
                let inc: Vec<bool> = pos.iter().map(|&j| c.included[j]).collect();
                let s = mia::scores_keyed(kind, den, &[], &crow, &keys, t, &plan.score)?;
                out.extend(pos.iter().map(|&j| base + j).zip(scores::records(
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

/// Runs the plan's attacks on `den` (a loaded diffusers checkpoint) with the split's members and
/// non-members; `max_examples` keeps a seeded random subset of that many of each (a reduced set
/// for quick runs). The many-runs audit reads a scores file of independent trials instead. Without a stated mechanism (see [`run_with_basis`]) results have no
/// theoretical limit. Returns the report and every score record (for `--scores-out`; record ids
/// are the data rows, canaries their ids).
#[allow(clippy::too_many_arguments)]
pub fn run(
    ck: &DiffusersCheckpoint,
    den: &DiffusersDenoiser<'_>,
    images: &ImageSet,
    split: &SplitManifest,
    split_path: &Path,
    plan: &MiaPlan,
    max_examples: Option<usize>,
    device: &str,
    bar: Option<&ProgressBar>,
) -> Result<(MiaReport, Vec<scores::ScoreRecord>)> {
    run_with_basis(
        ck,
        den,
        images,
        split,
        split_path,
        plan,
        max_examples,
        device,
        bar,
        None,
    )
}

/// [`run`] with the guarantee of the training mechanism (the folder's dpaudit ledger, or a
/// stated one: [`super::mechanism::diffusers_basis`]): every attack is compared with its limit.
#[allow(clippy::too_many_arguments)]
pub fn run_with_basis(
    ck: &DiffusersCheckpoint,
    den: &DiffusersDenoiser<'_>,
    images: &ImageSet,
    split: &SplitManifest,
    split_path: &Path,
    plan: &MiaPlan,
    max_examples: Option<usize>,
    device: &str,
    bar: Option<&ProgressBar>,
    basis: Option<&Basis>,
) -> Result<(MiaReport, Vec<scores::ScoreRecord>)> {
    let start = std::time::Instant::now();
    let rows = attacked_rows(ck, images, split, split_path, plan, max_examples)?;
    crate::timing::note("rows", start);
    let records: Vec<ScoreRecord> = score_shard(den, images, &rows, plan, bar, None)?
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let t0 = std::time::Instant::now();
    let mut report = assemble(
        ck, images, split, split_path, &rows, plan, device, &records, basis, start,
    )?;
    crate::timing::note("metrics and report", t0);
    let (members, nonmembers) = (images.rows(&rows.members), images.rows(&rows.nonmembers));
    let (cosine, table2) = super::pipeline::extras(den, &den.schedule, &members, &nonmembers, plan, bar)?;
    report.cosine = cosine;
    report.table2 = table2;
    report.elapsed_s = start.elapsed().as_secs_f64();
    Ok((report, records))
}

/// The report of `records` (from [`score_shard`] without a shard, or merged shards): metrics,
/// the one-run audit, comparisons with `basis`.
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    ck: &DiffusersCheckpoint,
    images: &ImageSet,
    split: &SplitManifest,
    split_path: &Path,
    rows: &AttackedRows,
    plan: &MiaPlan,
    device: &str,
    records: &[ScoreRecord],
    basis: Option<&Basis>,
    start: std::time::Instant,
) -> Result<MiaReport> {
    let name = ck.dir.display().to_string();
    let card = crate::models::diffusers_train::UnetCard::load(card_dir(ck))?;
    let white_box = match &card {
        Some(c) => super::pipeline::white_box_audit_of(
            c.white_box_canaries(),
            c.dp.as_ref(),
            card_dir(ck),
            &card_dir(ck).join(crate::models::diffusers_train::CARD),
            plan,
        )?,
        None => None,
    };
    // With gradient canaries the one-run audit is the white-box one; the scores are black-box
    // attacks on the split only.
    let black_box_plan = MiaPlan {
        audit: if rows.canaries.is_some() { plan.audit } else { None },
        ..plan.clone()
    };
    let Evaluated {
        results,
        null_results,
        mut one_run,
        many_runs,
        mut comparisons,
    } = evaluate_scores(
        records,
        if white_box.is_some() { &black_box_plan } else { plan },
        basis,
        Some(&name),
    )?;
    if let Some(wb) = &white_box {
        // The white-box bound is the report's one-run audit unless input canaries of the same
        // run were audited black-box (then both are compared with the ledger, and the white-box
        // record stays in `white_box`).
        let s = super::pipeline::white_box_comparisons(wb, basis, &mut comparisons);
        if one_run.is_none() {
            one_run = Some(s);
        }
    }
    let record = rows.training.as_ref();
    let mut warnings = Vec::new();
    if let Some(c) = &card {
        if c.training.randomness != crate::models::checkpoint::RANDOMNESS_OS {
            warnings.push(format!("training randomness: {}", c.training.randomness));
        }
    }
    if let Some(b) = basis {
        warnings.extend(b.skipped.iter().map(|s| format!("accountant not used: {s}")));
    }
    if let Some(s) = &rows.subset {
        warnings.push(s.clone());
    }
    Ok(MiaReport {
        schema: "dpaudit.mia/2".into(),
        target: Some(TargetInfo {
            checkpoint: name,
            arch: ck.model.config.describe(),
            parameters: ck.model.parameters,
            trained_on: "members".into(),
            train_rows: record.and_then(|r| r.rows).unwrap_or(split.members.len()),
            steps: record.and_then(|r| r.steps).unwrap_or(0) as usize,
            command: record
                .and_then(|r| r.command.clone())
                .unwrap_or_else(|| "(no training.json beside the checkpoint)".into()),
            randomness: card
                .as_ref()
                .map(|c| c.training.randomness.clone())
                .unwrap_or_else(|| "unknown (trained outside dpaudit)".into()),
            dp: card.and_then(|c| c.dp),
        }),
        scores_file: None,
        split: split_path.display().to_string(),
        data: images.path.display().to_string(),
        device: device.to_string(),
        seed: plan.score.seed,
        delta: plan.metric.delta,
        confidence: 1.0 - plan.metric.alpha,
        checkpoint_basis: basis.cloned(),
        sampler_basis: None,
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

/// SHA-256 standing for a diffusers folder's content in a part file: of the names and SHA-256
/// of its config, weights, scheduler config and dpaudit files (card, ledger, canaries, training
/// record) that exist.
pub fn folder_sha256(unet_dir: &Path) -> Result<String> {
    use crate::models::diffusers_train as dt;
    let mut text = String::new();
    for name in [
        "config.json",
        crate::models::diffusers::WEIGHTS,
        dt::SCHEDULER,
        dt::CARD,
        dt::LEDGER,
        dt::CANARIES,
        dt::GRADIENT_CANARIES,
        dt::OBSERVATIONS,
        dt::TRAINING,
    ] {
        let p = unet_dir.join(name);
        if p.is_file() {
            text.push_str(&format!("{name} {}\n", crate::models::data::sha256_file(&p)?));
        }
    }
    Ok(crate::models::data::sha256_hex(text.as_bytes()))
}

/// The largest change of the scores in `records` (computed at the current precision) when the
/// first `sample` members and the first `sample` non-members are scored again in fp32 with the
/// same attacks, steps and noise (a record's noise depends only on its position, so the sample's
/// records get the same draws). Returns (records compared, largest absolute change, largest
/// relative change). Restores the current precision.
pub fn fp32_score_change(
    den: &DiffusersDenoiser<'_>,
    images: &ImageSet,
    split: &SplitManifest,
    plan: &MiaPlan,
    records: &[scores::ScoreRecord],
    sample: usize,
) -> Result<(usize, f64, f64)> {
    use crate::models::precision::{self, Precision};
    let member_ix: Vec<usize> = split.members.iter().take(sample).copied().collect();
    let nonmember_ix: Vec<usize> = split.nonmembers.iter().take(sample).copied().collect();
    let (members, nonmembers) = (images.rows(&member_ix), images.rows(&nonmember_ix));
    let ids: Vec<String> = member_ix.iter().chain(&nonmember_ix).map(|i| i.to_string()).collect();
    let mut have = std::collections::HashMap::new();
    for r in records.iter().filter(|r| r.set == ScoreSet::Split) {
        have.insert((r.attack, r.t, r.record_id.clone()), r.score);
    }
    let before = precision::current();
    precision::set(Precision::Fp32);
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
    precision::set(before);
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
