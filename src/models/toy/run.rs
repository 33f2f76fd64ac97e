//! `dpaudit train` of the 8×8 models: what the [`crate::models::train`] orchestrator needs
//! from this family ([`ToyFamily`]: ghost clipping or the per-sample loop, the DDPM batch loss,
//! `<stem>.safetensors` and the card) and its [`setup`] (the digits data, the model fresh or
//! from `--init`, RAPID's public pretraining and knowledge base).
//!
//! `--init M` either composes M's ledger into the new one, or — when M has no ledger — is
//! refused if M's trained-on rows overlap the private rows (by the split and row hashes of M's
//! card).

use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{Device, Var};
use rand::Rng;
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

use super::checkpoint::{self, Card};
use super::dp::{clipped_grad_sum, KnowledgeBase, PerSample, Retrieval};
use super::train::{batch_loss, Batch};
use super::{Checkpoint, ModelConfig, Net, PIXELS};
use crate::data::digits::{indices_sha256, sha256_file};
use crate::data::{Dataset, SplitManifest};
use crate::diffusion::schedule::table::{TrainingSchedule, TrainingScheduleConfig};
use crate::error::{Error, Result};
use crate::events::DpEvent;
use crate::models::card::RapidInfo;
use crate::models::dp::normals;
use crate::models::train::{self, ClippedSum, Examples, Family, Layout, Plan, Release, Role, Setup, Trained};

/// RAPID's retrieval variant: public pretraining, then the knowledge base of trajectories
/// (key at step k, value at step v < k) the DP fine-tuning retrieves its noise targets from.
#[derive(Debug, Clone, Copy)]
pub struct Rapid {
    /// Non-DP pretraining steps on the first half of the public rows.
    pub pretrain_steps: usize,
    /// Query step k.
    pub k: usize,
    /// Value step v < k.
    pub v: usize,
}

/// An 8×8 denoiser in training.
pub struct ToyFamily {
    /// The network (its variables are the ones trained).
    pub net: Net,
    schedule: TrainingSchedule,
    per_sample: PerSample,
    rag: Option<Retrieval>,
    rapid: Option<RapidInfo>,
}

impl ToyFamily {
    /// `net` trained on `schedule` with `per_sample` gradients, RAPID's retrieval when `rag`.
    pub fn new(net: Net, schedule: TrainingSchedule, per_sample: PerSample, rag: Option<Retrieval>) -> Self {
        ToyFamily {
            net,
            schedule,
            per_sample,
            rag,
            rapid: None,
        }
    }
}

impl Family for ToyFamily {
    type Card = Card;
    const GRADIENT_CANARY_SALT: u64 = 0x67ad_c4a7;
    const EVAL_ROWS: usize = usize::MAX;

    fn dim(&self) -> usize {
        PIXELS
    }

    fn vars(&self) -> Vec<(String, Var)> {
        super::train::vars(&self.net)
    }

    fn schedule(&self) -> &TrainingSchedule {
        &self.schedule
    }

    fn describe(&self) -> String {
        format!(
            "{}, {} parameters",
            format!("{:?}", self.net.config.arch).to_lowercase(),
            self.net.params.count()
        )
    }

    fn mechanism(&self) -> &'static str {
        if self.rag.is_some() {
            "RAPID Algorithm 2 with retrieval"
        } else {
            "RAPID Algorithm 2"
        }
    }

    fn per_sample(&self) -> &'static str {
        match (self.per_sample, self.net.supports_probe()) {
            (PerSample::Loop, _) | (PerSample::Auto, false) => "loop",
            _ => "ghost",
        }
    }

    fn backend(&self, dp: bool) -> &'static str {
        match (dp, self.per_sample(), self.net.device().is_cpu()) {
            (false, _, true) => "candle backward (CPU)",
            (false, _, false) => "candle backward (CUDA)",
            (true, "ghost", true) => "candle, ghost clipping (CPU)",
            (true, "ghost", false) => "candle, ghost clipping (CUDA)",
            (true, _, true) => "candle, one backward pass per sample (CPU)",
            (true, _, false) => "candle, one backward pass per sample (CUDA)",
        }
    }

    fn examples(&self, x0: &[f32], t: (usize, usize), rng: &mut ChaCha20Rng) -> Result<Examples> {
        match &self.rag {
            Some(r) => r.examples(&self.schedule, x0, t, rng),
            None => Ok(Examples::draw(&self.schedule, x0, PIXELS, t, rng)),
        }
    }

    fn clipped_sum(&mut self, ex: &Examples, clip: f64) -> Result<ClippedSum> {
        clipped_grad_sum(&self.net, ex, clip, self.per_sample)
    }

    fn plain_grads(
        &mut self,
        x0: &[f32],
        batch: usize,
        t_range: (usize, usize),
        rng: &mut ChaCha8Rng,
    ) -> Result<(GradStore, Option<f64>)> {
        let n = x0.len() / PIXELS;
        let mut xb = Vec::with_capacity(batch * PIXELS);
        let mut t = Vec::with_capacity(batch);
        for _ in 0..batch {
            let i = rng.random_range(0..n);
            xb.extend_from_slice(&x0[i * PIXELS..(i + 1) * PIXELS]);
            t.push(rng.random_range(t_range.0..=t_range.1));
        }
        let eps = normals(rng, batch * PIXELS);
        let b = Batch::new(&self.net, &self.schedule, &xb, &t, &eps)?;
        let loss = batch_loss(&self.net, &b)?;
        let grads = loss.backward()?;
        Ok((grads, Some(loss.to_scalar::<f32>()? as f64)))
    }

    fn eval_loss(&self, rows: &[f32], t: (usize, usize), seed: u64) -> Result<f64> {
        super::train::eval_loss(&self.net, &self.schedule, rows, t.0, t.1, seed, 4)
    }

    fn weights(&self) -> Result<Vec<u8>> {
        checkpoint::weights_bytes(&self.net)
    }

    fn card(&self, _plan: &Plan, r: Release) -> Result<(Card, Vec<(String, Vec<u8>)>)> {
        let stem = r.layout.stem.clone().unwrap_or_default();
        let mut dp = r.dp;
        if let Some(d) = dp.as_mut() {
            d.rapid = self.rapid.clone();
        }
        let mut card = Card {
            schema_version: checkpoint::CARD_SCHEMA,
            weights: String::new(),
            weights_sha256: String::new(),
            parameters: 0,
            model: self.net.config,
            schedule: self.schedule.config,
            data: r.data,
            training: r.training,
            dp,
            canaries: r.canaries,
            gradient_canaries: r.gradient_canaries,
        };
        checkpoint::describe_weights(&stem, &r.weights, &self.net, &mut card);
        let card_bytes = checkpoint::card_bytes(&card)?;
        let files = vec![
            (r.layout.name(Role::Weights), r.weights),
            (r.layout.name(Role::Card), card_bytes),
        ];
        Ok((card, files))
    }
}

/// The ledger an `--init` checkpoint brings, after checking it may be used at all.
fn init_cost(
    ck: &Checkpoint,
    init_path: &Path,
    data: &Dataset,
    private_ix: &[usize],
) -> Result<Option<(DpEvent, PathBuf)>> {
    if let Some(dp) = &ck.card.dp {
        return train::init_ledger(&ck.dir().join(&dp.ledger)).map(Some);
    }
    // No ledger: allowed only if its training rows are provably disjoint from the private rows.
    let refuse = |why: String| {
        Err(Error::field(
            "--init",
            format!(
                "{} has no DP ledger and {why}; its privacy cost cannot be composed. Start from a checkpoint trained on public rows or one with a ledger",
                init_path.display()
            ),
        ))
    };
    if ck.card.data.sha256 != data.sha256 {
        // A different data file: none of these private rows was trained on.
        return Ok(None);
    }
    let split_path = ck.split_file().unwrap_or_else(|_| PathBuf::from(&ck.card.data.split));
    let Ok(sha) = sha256_file(&split_path) else {
        return refuse(format!(
            "its split {} cannot be read to check for overlap",
            split_path.display()
        ));
    };
    if sha != ck.card.data.split_sha256 {
        return refuse(format!(
            "its split {} does not hash to its card's split_sha256",
            split_path.display()
        ));
    }
    let split = SplitManifest::load(&split_path)?;
    let rows = split.part(ck.card.data.trained_on);
    if indices_sha256(rows) != ck.card.data.rows_sha256 {
        return refuse("its trained-on rows do not hash to its card's rows_sha256".into());
    }
    let overlap = rows.iter().filter(|i| private_ix.contains(i)).count();
    if overlap > 0 {
        return refuse(format!("was trained without DP on {overlap} of the private rows"));
    }
    Ok(None)
}

/// The family and the rows of `plan` on `device`: the data and split, the model (fresh from
/// the public seed, or `--init`'s with its ledger), and for RAPID the public pretraining and the
/// knowledge base.
pub fn setup(
    plan: &Plan,
    model: &ModelConfig,
    schedule_config: TrainingScheduleConfig,
    rapid: Option<Rapid>,
    device: &Device,
) -> Result<(ToyFamily, Setup)> {
    let data = Dataset::load(&plan.data)?;
    let split = SplitManifest::load(&plan.split)?;
    split.check_data(&data).map_err(|e| e.with_file(&plan.split))?;
    let schedule = TrainingSchedule::new(schedule_config)?;
    // Public randomness (initialisation, non-DP batches, knowledge base): the seed, or the OS.
    let public_seed = plan.public_seed();
    let private_ix = split.part(plan.on).to_vec();
    let mut init_ledger = None;
    let net = match &plan.init {
        Some(p) => {
            let ck = Checkpoint::load(p, device)?;
            if ck.card.schedule != schedule_config {
                return Err(Error::field(
                    "--init",
                    format!(
                        "{} uses a different noise schedule ({:?})",
                        p.display(),
                        ck.card.schedule
                    ),
                ));
            }
            if plan.dp.is_some() {
                init_ledger = init_cost(&ck, p, &data, &private_ix)?;
            }
            ck.net
        }
        None => Net::new(model, public_seed, device)?,
    };
    let per_sample = plan.dp.map(|d| d.per_sample).unwrap_or_default();
    let mut fam = ToyFamily::new(net, schedule, per_sample, None);
    let mut t_max = plan.check(fam.schedule.len())?;
    if let (Some(r), Some(_)) = (&rapid, &plan.dp) {
        if plan.t_max.is_some() {
            return Err(Error::field(
                "--t-max",
                "RAPID fine-tunes steps ≤ --rapid-v; do not also give --t-max",
            ));
        }
        let len = fam.schedule.len();
        if !(r.v < r.k && r.k < len) {
            return Err(Error::field(
                "--rapid-k",
                format!("need v < k < T, got k = {}, v = {}", r.k, r.v),
            ));
        }
        let public = &split.public;
        if public.len() < 2 {
            return Err(Error::input("RAPID needs public rows in the split").with_file(&plan.split));
        }
        let (pre, refr) = public.split_at(public.len() / 2);
        let pretrain_steps = if plan.init.is_none() { r.pretrain_steps } else { 0 };
        if pretrain_steps > 0 {
            // Non-DP pretraining on the first half of the public rows, with its own Adam and
            // average (written back), from the public seed.
            let rows = data.rows(pre);
            let vars: Vec<Var> = fam.net.params.all_vars();
            let mut opt = train::adam(vars.clone(), plan.lr)?;
            let mut ema = train::Ema::new(vars, plan.ema)?;
            let t_all = (0, len - 1);
            let before = fam.eval_loss(&rows, t_all, public_seed)?;
            let b = crate::report::progress::bar(pretrain_steps as u64, plan.quiet, "pretrain");
            train::plain(
                &mut fam,
                &rows,
                pretrain_steps,
                plan.batch_size,
                t_all,
                public_seed ^ 0x9e7,
                &mut opt,
                &mut ema,
                Some(&b),
                |_, _, _| Ok(()),
            )?;
            b.finish_and_clear();
            ema.apply()?;
            let after = fam.eval_loss(&rows, t_all, public_seed)?;
            eprintln!(
                "pretrained on {} public rows: loss {before:.4} -> {after:.4}",
                pre.len()
            );
        }
        // A frozen deep copy of the pretrained model (`Net::clone` would share variables).
        let frozen = Net::new(&fam.net.config, 0, device)?;
        super::train::copy_params(&frozen, &fam.net)?;
        let kb = KnowledgeBase::build(&frozen, &fam.schedule, &data.rows(refr), r.k, r.v, public_seed)?;
        eprintln!(
            "knowledge base: {} trajectories (key at k = {}, value at v = {})",
            kb.len(),
            kb.k,
            kb.v
        );
        fam.rapid = Some(RapidInfo {
            k: r.k,
            v: r.v,
            pretrain_steps,
            pretrain_rows: pre.len(),
            kb_rows: refr.len(),
        });
        fam.rag = Some(Retrieval { kb, pretrained: frozen });
        t_max = r.v;
    }
    let setup = Setup {
        data_sha256: data.sha256.clone(),
        private: data.rows(&private_ix),
        public: data.rows(&split.public),
        private_ix,
        init_note: (plan.init.is_some() && init_ledger.is_none())
            .then(|| "trained without DP on rows disjoint from the private rows".to_string()),
        init_ledger,
        t_max,
        public_seed,
    };
    Ok((fam, setup))
}

/// Trains the 8×8 `model` (ignored with `--init`: the init's config wins) on `schedule` as
/// `plan` says, RAPID's retrieval variant when `rapid`, on `device` (described as `device_name`
/// in the card), and writes `<stem>.safetensors`, its card, the ledger and the canaries.
pub fn run(
    plan: &Plan,
    model: &ModelConfig,
    schedule: TrainingScheduleConfig,
    rapid: Option<Rapid>,
    device: &Device,
    device_name: &str,
) -> Result<Trained<Card>> {
    let layout = Layout::stem(&plan.out)?;
    let (fam, setup) = setup(plan, model, schedule, rapid, device)?;
    train::run(plan, fam, setup, layout, device_name)
}
