//! Sharded attacks: `mia --shard i/n` scores one n-th of the records and writes a part file with
//! the hashes of its inputs; [`merge`] checks that parts belong together and rebuilds the record
//! list of the unsharded run, so the merged report equals one run's (dpaudit never schedules:
//! Slurm job arrays or Kubernetes Indexed Jobs run the shards, docs/scale-out.md).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::mia::{AttackKind, MetricOpts, ScoreOpts};
use super::pipeline::{AuditKind, Basis, MiaPlan};
use super::scores::{ScoreRecord, ScoreSet};
pub use super::shard_spec::{ShardSpec, MAX_SHARDS};
use crate::data::digits::sha256_file;
use crate::error::{Error, Result};

/// Schema tag of a part file.
pub const PART_SCHEMA: &str = "dpaudit.mia-part/1";

/// What a part was computed from: paths as given and SHA-256 of their bytes. The checkpoint
/// card's hash covers the weights (the card carries the weights' SHA-256, checked on load).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartInputs {
    /// Checkpoint card path.
    pub checkpoint: PathBuf,
    /// SHA-256 of the card.
    pub checkpoint_sha256: String,
    /// Data file path.
    pub data: PathBuf,
    /// SHA-256 of the data file.
    pub data_sha256: String,
    /// Split manifest path.
    pub split: PathBuf,
    /// SHA-256 of the split manifest.
    pub split_sha256: String,
}

impl PartInputs {
    /// Hashes the three inputs.
    pub fn of(checkpoint: &Path, data: &Path, split: &Path) -> Result<Self> {
        Ok(PartInputs {
            checkpoint: checkpoint.to_path_buf(),
            checkpoint_sha256: input_sha256(checkpoint)?,
            data: data.to_path_buf(),
            data_sha256: sha256_file(data)?,
            split: split.to_path_buf(),
            split_sha256: sha256_file(split)?,
        })
    }

    /// Same bytes (paths may differ between machines).
    fn same_content(&self, other: &PartInputs) -> bool {
        self.checkpoint_sha256 == other.checkpoint_sha256
            && self.data_sha256 == other.data_sha256
            && self.split_sha256 == other.split_sha256
    }
}

/// SHA-256 of a part's checkpoint: of the card file, or for a diffusers UNet folder of its files
/// ([`super::subject::folder_sha256`]).
pub fn input_sha256(checkpoint: &Path) -> Result<String> {
    if checkpoint.is_dir() {
        super::subject::folder_sha256(checkpoint)
    } else {
        sha256_file(checkpoint)
    }
}

/// What a part of a diffusers folder's run also depends on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusersPart {
    /// `--max-examples`: the first N members and non-members are attacked.
    pub max_examples: Option<usize>,
    /// The guarantee the attacks are compared with (the folder's ledger or the stated
    /// mechanism), as the shard computed it.
    pub basis: Option<Basis>,
}

/// Everything of a [`MiaPlan`] that a shard's scores and the merged metrics depend on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartPlan {
    /// Attacks, in order.
    pub attacks: Vec<AttackKind>,
    /// Steps, in order.
    pub timesteps: Vec<usize>,
    /// Attack knobs (seed included).
    pub score: ScoreOpts,
    /// Bootstrap resamples.
    pub bootstrap: usize,
    /// Interval level.
    pub level: f64,
    /// δ of the guarantees and audits.
    pub delta: f64,
    /// The audits' β (the plan's `beta`; named `alpha` in part files).
    pub alpha: f64,
    /// Seed of the held-out split and bootstrap.
    pub metric_seed: u64,
    /// Null test requested.
    pub null_test: bool,
    /// The audit.
    pub audit: Option<AuditKind>,
    /// The sampler's accounting for the empirical attack.
    pub sampler: Option<Basis>,
    /// A diffusers folder's run (None: a dpaudit checkpoint card).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffusers: Option<DiffusersPart>,
}

impl PartPlan {
    /// The part-relevant fields of `plan`; refuses the extras that are not sharded.
    pub fn of(plan: &MiaPlan) -> Result<Self> {
        if plan.table2.is_some() {
            return Err(Error::field(
                "--shard",
                "cannot be combined with --table2 (run it unsharded)",
            ));
        }
        if !plan.cosine_steps.is_empty() {
            return Err(Error::field(
                "--shard",
                "cannot be combined with --cosine (run it unsharded)",
            ));
        }
        Ok(PartPlan {
            attacks: plan.attacks.clone(),
            timesteps: plan.timesteps.clone(),
            score: plan.score,
            bootstrap: plan.metric.bootstrap,
            level: plan.metric.level,
            delta: plan.metric.delta,
            alpha: plan.beta,
            metric_seed: plan.metric.seed,
            null_test: plan.null_test,
            audit: plan.audit,
            sampler: plan.sampler.clone(),
            diffusers: None,
        })
    }

    /// The plan back.
    pub fn to_plan(&self) -> MiaPlan {
        MiaPlan {
            attacks: self.attacks.clone(),
            timesteps: self.timesteps.clone(),
            score: self.score,
            metric: MetricOpts {
                bootstrap: self.bootstrap,
                level: self.level,
                delta: self.delta,
                seed: self.metric_seed,
            },
            null_test: self.null_test,
            table2: None,
            cosine_steps: Vec::new(),
            audit: self.audit,
            sampler: self.sampler.clone(),
            beta: self.alpha,
        }
    }
}

/// One scored record and its position in the unsharded run's record list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartRecord {
    /// Position of the record (within its attack and step) in the unsharded run.
    pub position: usize,
    /// Record identifier.
    pub record_id: String,
    /// Member (canaries: included).
    pub member: bool,
    /// The attack.
    pub attack: AttackKind,
    /// The step.
    pub t: usize,
    /// The score (JSON floats round-trip exactly).
    pub score: f64,
    /// The population.
    pub set: ScoreSet,
}

impl PartRecord {
    /// The record at `position`.
    pub fn new(position: usize, r: &ScoreRecord) -> Self {
        PartRecord {
            position,
            record_id: r.record_id.clone(),
            member: r.member,
            attack: r.attack,
            t: r.t,
            score: r.score,
            set: r.set,
        }
    }

    fn record(&self) -> ScoreRecord {
        ScoreRecord {
            record_id: self.record_id.clone(),
            member: self.member,
            attack: self.attack,
            t: self.t,
            score: self.score,
            set: self.set,
        }
    }
}

/// A part file: one shard's scores with what they were computed from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MiaPart {
    /// [`PART_SCHEMA`].
    pub schema: String,
    /// Which shard.
    pub shard: ShardSpec,
    /// Inputs and their hashes.
    pub inputs: PartInputs,
    /// The plan.
    pub plan: PartPlan,
    /// The shard's records.
    pub records: Vec<PartRecord>,
}

impl MiaPart {
    /// Reads a part file, naming it in every error.
    pub fn load(path: &Path) -> Result<Self> {
        crate::report::output::verify_member(path)?;
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
        let text = crate::limits::read_text_capped(file, path)?;
        let part: MiaPart = serde_json::from_str(&text)
            .map_err(|e| Error::input(format!("not a dpaudit part file: {e}")).with_file(path))?;
        if part.schema != PART_SCHEMA {
            return Err(Error::field("schema", format!("`{}`, expected `{PART_SCHEMA}`", part.schema)).with_file(path));
        }
        if part.shard.count == 0 || part.shard.count > MAX_SHARDS || part.shard.index >= part.shard.count {
            return Err(Error::field("shard", "index must be below count").with_file(path));
        }
        Ok(part)
    }
}

/// The merged parts: inputs, plan, and the records in the unsharded run's order.
#[derive(Debug)]
pub struct Merged {
    /// The inputs (of the first part).
    pub inputs: PartInputs,
    /// The plan shared by all parts.
    pub plan: PartPlan,
    /// Every record, in the order one unsharded run produces them.
    pub records: Vec<ScoreRecord>,
    /// Each record's position in the unsharded run (parallel to `records`).
    pub positions: Vec<usize>,
    /// The part file each record came from (parallel to `records`), for errors.
    pub parts: Vec<PathBuf>,
}

impl Merged {
    /// Checks every record against the split and checkpoint the parts name: a split record at
    /// position p is row `all[p]` of members-then-non-members with `member = p < members`; a
    /// canary record is canary p − |split| with its inclusion bit; and every (attack, step) of
    /// the plan holds exactly one record per position (so one part relabelled `i/1` as if it
    /// were the complete run, or records dropped or invented, are refused).
    pub fn check_records(
        &self,
        ck: &crate::models::toy::Checkpoint,
        data: &crate::data::Dataset,
        split: &crate::data::SplitManifest,
    ) -> Result<()> {
        let (member_ix, nonmember_ix) = super::pipeline::split_rows(ck, data, split)?;
        let all: Vec<usize> = member_ix.iter().chain(&nonmember_ix).copied().collect();
        let gradient = ck.card.white_box_canaries().is_some() && ck.card.input_canaries().is_none();
        let canaries = match self.plan.audit {
            Some(AuditKind::OneRun) if !gradient => Some(crate::models::canary::Canaries::of_checkpoint(ck)?),
            _ => None,
        };
        let n_canaries = canaries.as_ref().map_or(0, |c| c.ids.len());
        for (k, (r, &p)) in self.records.iter().zip(&self.positions).enumerate() {
            // Errors name the part the record came from.
            let bad = |what: String| {
                let e = Error::input(format!("the parts do not match the split: {what}"));
                Err(match self.parts.get(k) {
                    Some(f) => e.with_file(f),
                    None => e,
                })
            };
            match r.set {
                ScoreSet::Split => {
                    let Some(row) = all.get(p) else {
                        return bad(format!(
                            "record {} at position {p} is past the split's {} rows",
                            r.record_id,
                            all.len()
                        ));
                    };
                    if r.record_id != row.to_string() {
                        return bad(format!(
                            "the record at position {p} is `{}`, the split's row there is {row}",
                            r.record_id
                        ));
                    }
                    if r.member != (p < member_ix.len()) {
                        return bad(format!(
                            "record {} is labelled {}, the split says {}",
                            r.record_id,
                            if r.member { "member" } else { "non-member" },
                            if p < member_ix.len() { "member" } else { "non-member" }
                        ));
                    }
                }
                ScoreSet::Canary => {
                    let j = p.checked_sub(all.len());
                    let Some((c, j)) = canaries.as_ref().zip(j).filter(|(c, j)| *j < c.ids.len()) else {
                        return bad(format!(
                            "canary record {} at position {p} is not a canary of the checkpoint",
                            r.record_id
                        ));
                    };
                    if r.record_id != c.ids[j] || r.member != c.included[j] {
                        return bad(format!(
                            "canary record {} at position {p} differs from the checkpoint's canary {} (id or inclusion bit)",
                            r.record_id, c.ids[j]
                        ));
                    }
                }
            }
        }
        let bad = |what: String| Err(Error::input(format!("the parts do not match the split: {what}")));
        for &a in &self.plan.attacks {
            for &t in &self.plan.timesteps {
                let of = |set: ScoreSet| {
                    self.records
                        .iter()
                        .filter(|r| r.attack == a && r.t == t && r.set == set)
                        .count()
                };
                let want_c = if a.target() == super::mia::Target::Checkpoint {
                    n_canaries
                } else {
                    0
                };
                let (got_s, got_c) = (of(ScoreSet::Split), of(ScoreSet::Canary));
                if got_s != all.len() || got_c != want_c {
                    return bad(format!(
                        "{} at t = {t} has {got_s} split and {got_c} canary records; the split and checkpoint make {} and {want_c} (a part is missing or relabelled)",
                        a.as_str(),
                        all.len()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Checks that `parts` are the complete set of one sharded run (same input hashes, same plan,
/// shards 0..n each exactly once, no record twice) and restores the unsharded record order:
/// by attack, then step (in plan order), then position.
pub fn merge(parts: &[(PathBuf, MiaPart)]) -> Result<Merged> {
    let (first_path, first) = parts
        .first()
        .ok_or_else(|| Error::input("merge needs at least one part file"))?;
    let n = first.shard.count;
    let mut seen = vec![None::<&Path>; n];
    for (path, p) in parts {
        if !p.inputs.same_content(&first.inputs) {
            return Err(Error::input(format!(
                "computed from other inputs than {} (checkpoint, data or split hash differs)",
                first_path.display()
            ))
            .with_file(path));
        }
        if serde_json::to_value(&p.plan).ok() != serde_json::to_value(&first.plan).ok() {
            return Err(Error::input(format!(
                "computed with another plan (attacks, steps, seed or metric settings) than {}",
                first_path.display()
            ))
            .with_file(path));
        }
        if p.shard.count != n {
            return Err(Error::field(
                "shard",
                format!("{} shards here, {n} in {}", p.shard.count, first_path.display()),
            )
            .with_file(path));
        }
        if let Some(prev) = seen[p.shard.index] {
            return Err(Error::field(
                "shard",
                format!("shard {}/{n} also in {}", p.shard.index, prev.display()),
            )
            .with_file(path));
        }
        seen[p.shard.index] = Some(path);
    }
    let missing: Vec<String> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(Error::input(format!("missing shard(s): {}", missing.join(", "))));
    }
    let attack_ix = |a: AttackKind| first.plan.attacks.iter().position(|&b| b == a);
    let t_ix = |t: usize| first.plan.timesteps.iter().position(|&u| u == t);
    let mut keyed = Vec::new();
    for (path, p) in parts {
        for r in &p.records {
            let (Some(a), Some(t)) = (attack_ix(r.attack), t_ix(r.t)) else {
                return Err(Error::input(format!(
                    "record {} ({} at t = {}) is outside the plan",
                    r.record_id,
                    r.attack.as_str(),
                    r.t
                ))
                .with_file(path));
            };
            if !p.shard.owns(r.position) {
                return Err(Error::input(format!(
                    "record at position {} does not belong to shard {}/{n}",
                    r.position, p.shard.index
                ))
                .with_file(path));
            }
            keyed.push(((a, t, r.position), r, path));
        }
    }
    keyed.sort_by_key(|(k, _, _)| *k);
    if let Some(w) = keyed.windows(2).find(|w| w[0].0 == w[1].0) {
        let (r, path) = (w[1].1, w[1].2);
        let also = if w[0].2 == path {
            String::new()
        } else {
            format!(", also in {}", w[0].2.display())
        };
        return Err(Error::input(format!(
            "record {} ({} at t = {}, position {}) appears twice{also}",
            r.record_id,
            r.attack.as_str(),
            r.t,
            r.position
        ))
        .with_file(path));
    }
    Ok(Merged {
        inputs: first.inputs.clone(),
        plan: first.plan.clone(),
        positions: keyed.iter().map(|(k, _, _)| k.2).collect(),
        parts: keyed.iter().map(|(_, _, p)| p.to_path_buf()).collect(),
        records: keyed.into_iter().map(|(_, r, _)| r.record()).collect(),
    })
}
