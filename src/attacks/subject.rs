//! The attacked model, whatever its kind, as data for the one attack chain
//! ([`super::pipeline::run`]): the denoiser, the rows attacked (members, non-members, input
//! canaries), how each record's noise stream is keyed, the guarantee the attacks are compared
//! with, the white-box canaries, what the report says about the model, and its warnings.
//!
//! Two kinds load into a [`Subject`]: a dpaudit 8×8 checkpoint card ([`Subject::card`]) and a
//! diffusers `UNet2DModel` folder ([`Subject::diffusers`]). Everything after loading (scores,
//! metrics, audits, Table 2, cosine, shards) is the same code for both.

use std::path::{Path, PathBuf};

use super::denoiser::Denoiser;
use super::plan::{card_target, checkpoint_basis, split_rows, AuditKind, Basis, MiaPlan, TargetInfo, WhiteBoxSource};
use super::scores::{ScoreRecord, ScoreSet};
use crate::data::digits::indices_sha256;
use crate::data::images::ImageSet;
use crate::data::{Dataset, SplitManifest};
use crate::diffusion::schedule::table::TrainingSchedule;
use crate::error::{Error, Result};
use crate::models::canary::Canaries;
use crate::models::diffusers::{DiffusersCheckpoint, DiffusersDenoiser};
use crate::models::toy::Checkpoint;

/// A loaded model of either kind.
pub enum Model {
    /// A dpaudit checkpoint card (the 8×8 MLP or UNet).
    Card(Box<Checkpoint>),
    /// A diffusers `UNet2DModel` folder, run with `batch` images per forward pass.
    Diffusers {
        /// The checkpoint.
        ck: Box<DiffusersCheckpoint>,
        /// Images per forward pass.
        batch: usize,
    },
}

impl Model {
    /// The executor that computes the model's outputs: candle for the 8×8 nets, the diffusers
    /// UNet's executor at its precision ([`DiffusersCheckpoint::executor`]).
    pub fn executor(&self) -> &'static str {
        match self {
            Model::Card(_) => "candle",
            Model::Diffusers { ck, .. } => ck.executor(),
        }
    }
}

/// The data a model is attacked on: the 8×8 digits of a card, or an image set.
pub enum Data {
    /// dpaudit's 8×8 digits (or any 64-value rows a card names).
    Digits(Dataset),
    /// Images of one shape (MNIST, PNG folders, `.npy`).
    Images(ImageSet),
}

impl Data {
    /// The rows `ix`, flat.
    pub fn rows(&self, ix: &[usize]) -> Vec<f32> {
        match self {
            Data::Digits(d) => d.rows(ix),
            Data::Images(i) => i.rows(ix),
        }
    }
}

/// How a record's noise stream is keyed: a record's scores are the same whichever shard
/// computes them, and each kind keeps the keys its reports were always computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keying {
    /// By data row index (8×8 cards).
    DataRow,
    /// By position within its own list: member i and non-member i share a stream (diffusers).
    ListPosition,
}

/// The records a run attacks, in the unsharded run's order: the members, then the non-members
/// (each list cut to `--max-examples` for a diffusers folder), then (one-run audits) the input
/// canaries.
#[derive(Debug, Clone)]
pub struct AttackedRows {
    /// Data rows of the members attacked.
    pub members: Vec<usize>,
    /// Data rows of the non-members attacked.
    pub nonmembers: Vec<usize>,
    /// The input canaries (with `--audit one-run`).
    pub canaries: Option<Canaries>,
    /// How noise streams are keyed.
    pub keys: Keying,
    /// What `--max-examples` drew, for the report (None: every row).
    pub subset: Option<String>,
}

impl AttackedRows {
    /// The split rows (members then non-members) by position.
    pub fn split_rows(&self) -> Vec<usize> {
        self.members.iter().chain(&self.nonmembers).copied().collect()
    }

    /// The noise key of the split record at position `p`.
    pub fn key(&self, p: usize) -> u64 {
        match self.keys {
            Keying::DataRow => self.split_rows()[p] as u64,
            Keying::ListPosition if p < self.members.len() => p as u64,
            Keying::ListPosition => (p - self.members.len()) as u64,
        }
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

/// Everything the one attack chain needs about the attacked model.
pub struct Subject {
    /// The model.
    pub model: Model,
    /// Its data.
    pub data: Data,
    /// The split.
    pub split: SplitManifest,
    /// The rows attacked.
    pub rows: AttackedRows,
    /// The guarantee the checkpoint's attacks and audits are compared with.
    pub basis: Option<Basis>,
    /// The card's gradient canaries (audited white-box with `--audit one-run`).
    pub white_box: Option<WhiteBoxSource>,
    /// What the report says about the model.
    pub target: TargetInfo,
    /// The report's warnings about the model (seeded training, accountants not used, subsets).
    pub warnings: Vec<String>,
    /// The data and split as the report names them.
    pub data_label: String,
    /// See `data_label`.
    pub split_label: String,
}

/// The ε-predictor of a [`Subject`], with its DDPM schedule.
pub enum Eps<'a> {
    /// An 8×8 checkpoint.
    Card(&'a Checkpoint),
    /// A diffusers UNet.
    Diffusers(DiffusersDenoiser<'a>),
}

impl Eps<'_> {
    /// The one ε-prediction trait.
    pub fn denoiser(&self) -> &dyn Denoiser {
        match self {
            Eps::Card(c) => *c,
            Eps::Diffusers(d) => d,
        }
    }
    /// The DDPM schedule.
    pub fn schedule(&self) -> &TrainingSchedule {
        match self {
            Eps::Card(c) => &c.schedule,
            Eps::Diffusers(d) => &d.schedule,
        }
    }
}

impl Subject {
    /// The model as an ε-predictor.
    pub fn eps(&self) -> Result<Eps<'_>> {
        Ok(match (&self.model, &self.data) {
            (Model::Card(c), _) => Eps::Card(c),
            (Model::Diffusers { ck, batch }, Data::Images(i)) => Eps::Diffusers(ck.denoiser(i.shape, *batch)?),
            (Model::Diffusers { .. }, Data::Digits(_)) => {
                return Err(Error::input("a diffusers checkpoint is attacked on an image set"))
            }
        })
    }

    /// The checkpoint's path as part files and the report name it (the card, or the UNet folder).
    pub fn path(&self) -> PathBuf {
        match &self.model {
            Model::Card(c) => c.card_path.clone(),
            Model::Diffusers { ck, .. } => ck.dir.clone(),
        }
    }

    /// A dpaudit checkpoint card with its data and split: checks the split is the one the model
    /// was trained on; loads the input canaries for a one-run audit.
    pub fn card(ck: Checkpoint, data: Dataset, split: SplitManifest, plan: &MiaPlan) -> Result<Subject> {
        let (members, nonmembers) = split_rows(&ck, &data, &split)?;
        // Input canaries are attacked like records; gradient canaries are audited from their
        // observations ([`super::pipeline::white_box_audit_of`]), not scored.
        let gradient = ck.card.white_box_canaries().is_some() && ck.card.input_canaries().is_none();
        let canaries = match plan.audit {
            Some(AuditKind::OneRun) if !gradient => Some(Canaries::of_checkpoint(&ck)?),
            _ => None,
        };
        let basis = checkpoint_basis(&ck, plan.metric.delta)?;
        let mut warnings = Vec::new();
        if ck.card.training.randomness != crate::models::card::RANDOMNESS_OS {
            warnings.push(format!("training randomness: {}", ck.card.training.randomness));
        }
        if let Some(b) = &basis {
            warnings.extend(b.skipped.iter().map(|s| format!("accountant not used: {s}")));
        }
        let white_box = ck.card.white_box_canaries().map(|c| WhiteBoxSource {
            canaries: c.clone(),
            dp: ck.card.dp.clone(),
            dir: ck.dir().to_path_buf(),
            card_path: ck.card_path.clone(),
        });
        let c = &ck.card;
        Ok(Subject {
            target: card_target(&ck),
            data_label: c.data.file.clone(),
            split_label: c.data.split.clone(),
            rows: AttackedRows {
                members,
                nonmembers,
                canaries,
                keys: Keying::DataRow,
                subset: None,
            },
            basis,
            white_box,
            warnings,
            model: Model::Card(Box::new(ck)),
            data: Data::Digits(data),
            split,
        })
    }

    /// A diffusers folder with its images and split: checks the plan against what the folder
    /// supports and the split against the folder's training record, draws the `max_examples`
    /// subset, loads the input canaries of a one-run audit; `basis` is the folder's ledger or
    /// the stated mechanism ([`super::mechanism::diffusers_basis`]).
    #[allow(clippy::too_many_arguments)]
    pub fn diffusers(
        ck: DiffusersCheckpoint,
        batch: usize,
        images: ImageSet,
        split: SplitManifest,
        split_path: &Path,
        plan: &MiaPlan,
        max_examples: Option<usize>,
        basis: Option<Basis>,
    ) -> Result<Subject> {
        images.check_split(&split, split_path)?;
        if plan.audit == Some(AuditKind::ManyRuns) {
            return Err(Error::field(
                "--audit",
                "many-runs reads a --scores file of independent trials; a diffusers folder supports one-run (train --unet … --canaries m)",
            ));
        }
        let dir = card_dir(&ck).to_path_buf();
        let record_path = if ck.dir.join("training.json").is_file() {
            ck.dir.join("training.json")
        } else {
            dir.join("training.json")
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
        let card = crate::models::diffusers_train::UnetCard::load(&dir)?;
        // Input canaries are scored like records; gradient canaries are audited from the
        // observations the trainer recorded, not scored.
        let gradient = card
            .as_ref()
            .is_some_and(|c| c.input_canaries().is_none() && c.white_box_canaries().is_some());
        let canaries = match plan.audit {
            Some(AuditKind::OneRun) if !gradient => {
                let (c, _) = card_canaries(&dir)?;
                if c.dim != images.dim() {
                    return Err(Error::input(format!(
                        "the canaries have {} values, the images {}",
                        c.dim,
                        images.dim()
                    ))
                    .with_file(dir.join(crate::models::folder::CANARIES)));
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
        let mut warnings = Vec::new();
        if let Some(c) = &card {
            if c.training.randomness != crate::models::card::RANDOMNESS_OS {
                warnings.push(format!("training randomness: {}", c.training.randomness));
            }
        }
        if let Some(b) = &basis {
            warnings.extend(b.skipped.iter().map(|s| format!("accountant not used: {s}")));
        }
        if let Some(s) = &subset {
            warnings.push(s.clone());
        }
        let record = training.as_ref();
        let white_box = card.as_ref().and_then(|c| {
            c.white_box_canaries().map(|w| WhiteBoxSource {
                canaries: w.clone(),
                dp: c.dp.clone(),
                dir: dir.clone(),
                card_path: dir.join(crate::models::folder::CARD),
            })
        });
        Ok(Subject {
            target: TargetInfo {
                checkpoint: ck.dir.display().to_string(),
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
            },
            data_label: images.path.display().to_string(),
            split_label: split_path.display().to_string(),
            rows: AttackedRows {
                members,
                nonmembers,
                canaries,
                keys: Keying::ListPosition,
                subset,
            },
            basis,
            white_box,
            warnings,
            model: Model::Diffusers {
                ck: Box::new(ck),
                batch,
            },
            data: Data::Images(images),
            split,
        })
    }
}

/// `training.json` beside a diffusers checkpoint (written by scripts/train_mnist_ddpm.py): what
/// the model was trained on, checked against the split.
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

/// The folder `train --unet` wrote its card in (the UNet folder).
fn card_dir(ck: &DiffusersCheckpoint) -> &Path {
    ck.config_path.parent().unwrap_or(&ck.dir)
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
fn card_canaries(dir: &Path) -> Result<(Canaries, PathBuf)> {
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
    Ok((card.canaries(dir)?, dir.join(crate::models::folder::CARD)))
}

/// [`card_canaries`] of a diffusers checkpoint given as `path` (the UNet folder, a pipeline
/// folder with `unet/`, or its `config.json`): the canaries a one-run audit of it must score.
pub fn folder_canaries(path: &Path) -> Result<(Canaries, PathBuf)> {
    let udir = crate::models::folder::unet_dir(path).unwrap_or_else(|| path.to_path_buf());
    card_canaries(&udir)
}

/// SHA-256 standing for a diffusers folder's content in a part file: of the names and SHA-256
/// of its config, weights, scheduler config and dpaudit files (card, ledger, canaries, training
/// record) that exist.
pub fn folder_sha256(unet_dir: &Path) -> Result<String> {
    use crate::models::diffusers_train as dt;
    let mut text = String::new();
    for name in [
        "config.json",
        crate::models::folder::WEIGHTS,
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
            text.push_str(&format!("{name} {}\n", crate::data::digits::sha256_file(&p)?));
        }
    }
    Ok(crate::data::digits::sha256_hex(text.as_bytes()))
}
