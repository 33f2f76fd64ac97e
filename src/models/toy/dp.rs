//! DP training: RAPID's Algorithm 2 (Jiang et al., "RAPID: Retrieval augmented training of
//! differentially private diffusion models", ICLR 2025) as an executed pipeline.
//!
//! Each iteration (Alg. 2, lines 2–14): draw a Poisson sample 𝓑 of the private rows (each row
//! independently with probability q); compute each row's gradient g(x); clip it to
//! g(x)/max(1, ‖g(x)‖/C); add N(0, σ²C² I) to the sum and divide by the expected batch size
//! B = q·n (the Opacus convention for Poisson sampling; Alg. 2 writes 1/B); take an Adam step.
//! Each iteration is one `PoissonSampled { q, Gaussian { σ } }` event under add/remove-one
//! neighbouring (the sum of clipped gradients has L2 sensitivity C), so a run of `I` iterations is
//! `DpEvent::dpsgd(σ, q, I)` (RAPID Thm 1 states its per-step RDP, (α, 2α/σ²) in their
//! normalisation; we leave the accounting to the accountants). The ledger records what ran, built
//! step by step with [`EventBuilder`].
//!
//! RAPID's retrieval variant ([`KnowledgeBase`], §3.3–3.4): the model is first pretrained on
//! public rows; a knowledge base stores, for other public rows, key = features of x_k and
//! value = x_v on the same forward trajectory (k > v). For a private x, x_k ~ q(x_k | x) is the
//! query; the nearest key's value x̂_v gives the noise target ε̂ = (x̂_v − √ᾱ_v x)/√(1−ᾱ_v), and the
//! model is fine-tuned only on steps v' ≤ v with x_{v'} = √ᾱ_{v'} x + √(1−ᾱ_{v'}) ε̂ (Eq. 5, with
//! the squared norm). Simplification, stated: the feature extractor h is the pretrained model's
//! one-step denoised x̂₀ (no contrastive training of h, Alg. 1).

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, D};
use candle_nn::Optimizer;
use indicatif::ProgressBar;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::events::{DpEvent, EventBuilder};

use super::net::Probe;
use super::train::{adam, Ema, TrainLog};
use super::{Net, PIXELS};
use crate::diffusion::schedule::table::{noisy, TrainingSchedule};
use crate::models::canary::{Defect, WhiteBoxRecorder, GRADIENT_CANARY_NORM};
use crate::models::dp::{normals, release_with, secret_rng};

/// How per-sample gradients are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PerSample {
    /// One backward pass with per-sample norms from layer activations (MLP), else the loop.
    #[default]
    Auto,
    /// One backward pass (MLP only).
    Ghost,
    /// One backward pass per sample (any architecture; the reference).
    Loop,
}

/// DP-SGD settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DpConfig {
    /// σ: the noise std is σ·C.
    pub noise_multiplier: f64,
    /// Per-sample gradient norm bound C.
    pub clip: f64,
    /// Poisson sampling rate q.
    pub sample_rate: f64,
    /// Iterations.
    pub steps: u64,
    /// Adam learning rate.
    pub lr: f64,
    /// EMA decay of the released weights.
    pub ema_decay: f64,
    /// None (the default): Poisson sampling, the examples' (t, ε) and the Gaussian noise come
    /// from a ChaCha20 CSPRNG keyed by the operating system ([`secret_rng`]), so nobody can
    /// replay them. Some(seed): reproducible, and not private against whoever knows the seed.
    pub seed: Option<u64>,
    /// δ written into the ledger.
    pub delta: f64,
    /// Lowest step trained.
    pub t_min: usize,
    /// Highest step trained.
    pub t_max: usize,
    /// Per-sample gradient method.
    pub per_sample: PerSample,
}

/// What a DP training run can do besides training: record a white-box audit's observations,
/// and (tests only) run with a known defect.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Gradient canaries to insert and observe.
    pub white_box: Option<&'a mut WhiteBoxRecorder>,
    /// A defect to train with (tests of the audit; never a user flag).
    #[doc(hidden)]
    pub defect: Option<Defect>,
}

impl DpConfig {
    /// Checks every setting; errors name the flag.
    pub fn validate(&self, schedule: &TrainingSchedule) -> Result<()> {
        if !(self.noise_multiplier > 0.0 && self.noise_multiplier.is_finite()) {
            return Err(Error::field("--noise-multiplier", "must be a finite number > 0"));
        }
        if !(self.clip > 0.0 && self.clip.is_finite()) {
            return Err(Error::field("--clip", "must be a finite number > 0"));
        }
        if !(self.sample_rate > 0.0 && self.sample_rate <= 1.0) {
            return Err(Error::field("--sample-rate", "must be in (0, 1]"));
        }
        if self.steps == 0 {
            return Err(Error::field("--steps", "must be ≥ 1"));
        }
        if !(self.delta > 0.0 && self.delta < 1.0) {
            return Err(Error::field("--delta", "must be in (0, 1)"));
        }
        if self.lr.is_nan() || self.lr <= 0.0 {
            return Err(Error::field("--lr", "must be > 0"));
        }
        if self.t_min > self.t_max || self.t_max >= schedule.len() {
            return Err(Error::field(
                "--t-max",
                format!("need t_min ≤ t_max < {}", schedule.len()),
            ));
        }
        Ok(())
    }

    /// The event one run of these settings is: `steps` × Poisson(q) ∘ Gaussian(σ).
    pub fn event(&self) -> DpEvent {
        DpEvent::dpsgd(self.noise_multiplier, self.sample_rate, self.steps)
    }
}

/// One (noised) training example: x_t, t and the noise target.
pub struct Examples {
    /// x_t rows.
    pub xt: Vec<f32>,
    /// Steps.
    pub t: Vec<usize>,
    /// Noise targets.
    pub eps: Vec<f32>,
}

impl Examples {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.t.len()
    }
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }
    fn tensors(&self, net: &Net, rows: std::ops::Range<usize>) -> Result<(Tensor, Tensor, Tensor)> {
        let n = rows.len();
        let dev = net.device();
        let px = rows.start * PIXELS..rows.end * PIXELS;
        Ok((
            Tensor::from_slice(&self.xt[px.clone()], (n, PIXELS), dev)?,
            Tensor::from_vec(self.t[rows].iter().map(|&v| v as f32).collect::<Vec<_>>(), n, dev)?,
            Tensor::from_slice(&self.eps[px], (n, PIXELS), dev)?,
        ))
    }
}

/// Σᵢ clip_C(gᵢ) over the examples, by parameter name, and the per-sample norms ‖gᵢ‖, where gᵢ
/// is the gradient of example i's loss (mean squared ε error over the 64 pixels).
pub fn clipped_grad_sum(
    net: &Net,
    ex: &Examples,
    clip: f64,
    method: PerSample,
) -> Result<(HashMap<String, Tensor>, Vec<f64>)> {
    let use_ghost = match method {
        PerSample::Auto => net.supports_probe(),
        PerSample::Ghost => {
            if !net.supports_probe() {
                return Err(Error::field(
                    "--per-sample",
                    "`ghost` needs the MLP; use `loop` for the UNet",
                ));
            }
            true
        }
        PerSample::Loop => false,
    };
    if ex.is_empty() {
        let zeros = net
            .params
            .vars
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().zeros_like()?)))
            .collect::<Result<HashMap<_, _>>>()?;
        return Ok((zeros, Vec::new()));
    }
    if use_ghost {
        ghost(net, ex, clip)
    } else {
        per_sample_loop(net, ex, clip)
    }
}

fn clip_factor(norm: f64, clip: f64) -> f64 {
    1.0 / (norm / clip).max(1.0)
}

fn ghost(net: &Net, ex: &Examples, clip: f64) -> Result<(HashMap<String, Tensor>, Vec<f64>)> {
    let (xt, t, eps) = ex.tensors(net, 0..ex.len())?;
    let probe = Probe::default();
    let pred = net.forward_probed(&xt, &t, Some(&probe))?;
    let per = (pred - eps)?.sqr()?.mean(D::Minus1)?;
    let grads = per.sum_all()?.backward()?;
    let layers = probe.layers.borrow();
    let b = ex.len();
    let mut sq = Tensor::zeros(b, candle_core::DType::F32, net.device())?;
    let mut gs = Vec::with_capacity(layers.len());
    for l in layers.iter() {
        let g = grads
            .get(l.probe.as_tensor())
            .ok_or_else(|| Error::model("probe gradient missing"))?
            .clone();
        let a2 = (l.input.sqr()?.sum(D::Minus1)? + 1.0)?;
        sq = (sq + g.sqr()?.sum(D::Minus1)?.mul(&a2)?)?;
        gs.push(g);
    }
    let norms: Vec<f64> = sq.to_vec1::<f32>()?.iter().map(|&s| (s as f64).sqrt()).collect();
    let c: Vec<f32> = norms.iter().map(|&n| clip_factor(n, clip) as f32).collect();
    let c = Tensor::from_vec(c, (b, 1), net.device())?;
    let mut out: HashMap<String, Tensor> = HashMap::new();
    for (l, g) in layers.iter().zip(gs) {
        let gc = g.broadcast_mul(&c)?;
        let gw = gc.t()?.matmul(&l.input)?;
        let gb = gc.sum(0)?;
        for (name, grad) in [(&l.weight, gw), (&l.bias, gb)] {
            let e = out.remove(name);
            out.insert(name.clone(), if let Some(prev) = e { (prev + grad)? } else { grad });
        }
    }
    for (k, v) in &net.params.vars {
        if !out.contains_key(k) {
            out.insert(k.clone(), v.as_tensor().zeros_like()?);
        }
    }
    Ok((out, norms))
}

fn per_sample_loop(net: &Net, ex: &Examples, clip: f64) -> Result<(HashMap<String, Tensor>, Vec<f64>)> {
    let mut out: HashMap<String, Tensor> = HashMap::new();
    let mut norms = Vec::with_capacity(ex.len());
    for i in 0..ex.len() {
        let (xt, t, eps) = ex.tensors(net, i..i + 1)?;
        let loss = (net.forward(&xt, &t)? - eps)?.sqr()?.mean_all()?;
        let grads = loss.backward()?;
        let mut per: Vec<(String, Tensor)> = Vec::with_capacity(net.params.vars.len());
        let mut sq = 0.0f64;
        for (k, v) in &net.params.vars {
            let g = match grads.get(v.as_tensor()) {
                Some(g) => g.clone(),
                None => v.as_tensor().zeros_like()?,
            };
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            per.push((k.clone(), g));
        }
        let norm = sq.sqrt();
        norms.push(norm);
        let c = clip_factor(norm, clip);
        for (k, g) in per {
            let g = (g * c)?;
            let e = out.remove(&k);
            out.insert(k, if let Some(prev) = e { (prev + g)? } else { g });
        }
    }
    Ok((out, norms))
}

/// RAPID's trajectory knowledge base (§3.3): keys are features of x_k, values x_v.
pub struct KnowledgeBase {
    /// Query timestep k.
    pub k: usize,
    /// Value timestep v.
    pub v: usize,
    /// Keys [m, 64]: one-step denoised x̂₀ of x_k by the pretrained model.
    pub keys: Vec<f32>,
    /// Values [m, 64]: x_v on the same forward trajectory.
    pub values: Vec<f32>,
}

/// One-step denoised x̂₀ = (x_t − √(1−ᾱ_t) ε_θ(x_t, t))/√ᾱ_t for rows at a common step `t`.
pub fn denoise_x0(net: &Net, schedule: &TrainingSchedule, xt: &[f32], t: usize) -> Result<Vec<f32>> {
    let n = xt.len() / PIXELS;
    let eps = net.predict(xt, &vec![t; n])?;
    let a = schedule.alpha_bars[t];
    let (sa, sb) = (a.sqrt() as f32, (1.0 - a).sqrt() as f32);
    Ok(xt.iter().zip(&eps).map(|(x, e)| (x - sb * e) / sa).collect())
}

impl KnowledgeBase {
    /// Builds the knowledge base from public reference rows (`ref_x0`, [m, 64]) with the
    /// pretrained model: x_v ~ q(x_v | x), then x_k ~ q(x_k | x_v) (the forward chain, Eq. 1).
    pub fn build(
        pretrained: &Net,
        schedule: &TrainingSchedule,
        ref_x0: &[f32],
        k: usize,
        v: usize,
        seed: u64,
    ) -> Result<Self> {
        if !(v < k && k < schedule.len()) {
            return Err(Error::field(
                "--rapid-k",
                format!("need v < k < T, got k = {k}, v = {v}"),
            ));
        }
        let m = ref_x0.len() / PIXELS;
        if m == 0 {
            return Err(Error::input("knowledge base: no public reference rows"));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0cb0_0cb0);
        let e1 = normals(&mut rng, m * PIXELS);
        let values = noisy(schedule, ref_x0, &vec![v; m], &e1);
        let ratio = schedule.alpha_bars[k] / schedule.alpha_bars[v];
        let (sa, sb) = (ratio.sqrt() as f32, (1.0 - ratio).sqrt() as f32);
        let e2 = normals(&mut rng, m * PIXELS);
        let xk: Vec<f32> = values.iter().zip(&e2).map(|(x, e)| sa * x + sb * e).collect();
        let keys = denoise_x0(pretrained, schedule, &xk, k)?;
        Ok(KnowledgeBase { k, v, keys, values })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.keys.len() / PIXELS
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Index of the key nearest (L2) to `query` [64].
    pub fn nearest(&self, query: &[f32]) -> usize {
        let mut best = (f32::INFINITY, 0);
        for (i, key) in self.keys.chunks_exact(PIXELS).enumerate() {
            let d: f32 = key.iter().zip(query).map(|(a, b)| (a - b) * (a - b)).sum();
            if d < best.0 {
                best = (d, i);
            }
        }
        best.1
    }
}

/// The result of a DP run.
pub struct DpRun {
    /// Per-window mean per-sample gradient norms (a function of private data: not released).
    pub log: TrainLog,
    /// Loss on the public evaluation rows before and after (None without such rows).
    pub eval: Option<(f64, f64)>,
    /// The event that ran (built step by step).
    pub event: DpEvent,
    /// Mean realised Poisson batch size.
    pub mean_batch: f64,
}

/// Retrieval context for RAPID fine-tuning: the knowledge base and the frozen pretrained model.
pub struct Retrieval<'a> {
    /// RAPID's knowledge base.
    pub kb: &'a KnowledgeBase,
    /// The frozen pretrained model.
    pub pretrained: &'a Net,
}

/// Builds the per-example noise targets for the rows `x0` of a Poisson batch.
fn examples(
    schedule: &TrainingSchedule,
    x0: &[f32],
    cfg: &DpConfig,
    rag: Option<&Retrieval>,
    rng: &mut ChaCha20Rng,
) -> Result<Examples> {
    let n = x0.len() / PIXELS;
    match rag {
        None => {
            let t: Vec<usize> = (0..n).map(|_| rng.random_range(cfg.t_min..=cfg.t_max)).collect();
            let eps = normals(rng, n * PIXELS);
            let xt = noisy(schedule, x0, &t, &eps);
            Ok(Examples { xt, t, eps })
        }
        Some(r) => {
            let (k, v) = (r.kb.k, r.kb.v);
            // Query: x_k ~ q(x_k | x), features by the pretrained model.
            let e = normals(rng, n * PIXELS);
            let xk = noisy(schedule, x0, &vec![k; n], &e);
            let feats = denoise_x0(r.pretrained, schedule, &xk, k)?;
            let av = schedule.alpha_bars[v];
            let (sav, sbv) = (av.sqrt() as f32, (1.0 - av).sqrt() as f32);
            let mut eps = Vec::with_capacity(n * PIXELS);
            let mut t = Vec::with_capacity(n);
            for i in 0..n {
                let j = r.kb.nearest(&feats[i * PIXELS..(i + 1) * PIXELS]);
                let xv = &r.kb.values[j * PIXELS..(j + 1) * PIXELS];
                for p in 0..PIXELS {
                    eps.push((xv[p] - sav * x0[i * PIXELS + p]) / sbv);
                }
                t.push(rng.random_range(cfg.t_min..=cfg.t_max.min(v)));
            }
            let xt = noisy(schedule, x0, &t, &eps);
            Ok(Examples { xt, t, eps })
        }
    }
}

/// DP-SGD (RAPID Alg. 2) on the private rows `x0` ([n, 64]); EMA weights are written back.
/// The loss is evaluated (before and after) only on `eval_rows`, which must be public: a loss on
/// the private rows would be an unnoised statistic of them.
pub fn dp_train(
    net: &Net,
    schedule: &TrainingSchedule,
    x0: &[f32],
    cfg: &DpConfig,
    rag: Option<&Retrieval>,
    eval_rows: Option<&[f32]>,
    bar: Option<&ProgressBar>,
) -> Result<DpRun> {
    dp_train_with(net, schedule, x0, cfg, rag, eval_rows, bar, Hooks::default())
}

/// [`dp_train`] with [`Hooks`]: gradient canaries are inserted into the sum of clipped
/// gradients before the noise (each included canary Poisson-sampled at the run's q, like every
/// private row) and every released update is observed at their coordinates.
#[allow(clippy::too_many_arguments)]
pub fn dp_train_with(
    net: &Net,
    schedule: &TrainingSchedule,
    x0: &[f32],
    cfg: &DpConfig,
    rag: Option<&Retrieval>,
    eval_rows: Option<&[f32]>,
    bar: Option<&ProgressBar>,
    mut hooks: Hooks,
) -> Result<DpRun> {
    cfg.validate(schedule)?;
    let defect = hooks.defect;
    let q_run = if defect == Some(Defect::SampleRateDoubled) {
        (2.0 * cfg.sample_rate).min(1.0)
    } else {
        cfg.sample_rate
    };
    let clip_run = if defect == Some(Defect::ClippingSkipped) {
        f64::INFINITY
    } else {
        cfg.clip
    };
    let n = x0.len() / PIXELS;
    if n == 0 {
        return Err(Error::input("no private rows"));
    }
    let eval_seed = cfg.seed.unwrap_or(0);
    let eval = |net: &Net| -> Result<Option<f64>> {
        match eval_rows.filter(|r| !r.is_empty()) {
            Some(rows) => Ok(Some(super::train::eval_loss(
                net, schedule, rows, cfg.t_min, cfg.t_max, eval_seed, 4,
            )?)),
            None => Ok(None),
        }
    };
    let mut log = TrainLog::default();
    let before = eval(net)?;
    let mut opt = adam(net, cfg.lr)?;
    let mut ema = Ema::new(net, cfg.ema_decay)?;
    let mut rng = secret_rng(cfg.seed.map(|s| s ^ 0x5a3b));
    let mut noise_rng = secret_rng(cfg.seed);
    let expected_batch = cfg.sample_rate * n as f64;
    let mut ledger = EventBuilder::new();
    let step_event = DpEvent::poisson(cfg.sample_rate, DpEvent::gaussian(cfg.noise_multiplier));
    let step_event = if cfg.sample_rate >= 1.0 {
        DpEvent::gaussian(cfg.noise_multiplier)
    } else {
        step_event
    };
    let log_every = (cfg.steps as usize / 50).max(1);
    let (mut acc, mut acc_n, mut total_batch) = (0.0f64, 0usize, 0usize);
    let std = cfg.noise_multiplier * cfg.clip;
    for step in 1..=cfg.steps as usize {
        // Poisson sampling (Alg. 2 line 2).
        let mut rows = Vec::new();
        for i in 0..n {
            if rng.random::<f64>() < q_run {
                rows.extend_from_slice(&x0[i * PIXELS..(i + 1) * PIXELS]);
            }
        }
        let ex = examples(schedule, &rows, cfg, rag, &mut rng)?;
        total_batch += ex.len();
        // Per-sample gradients, clipping (lines 3–11).
        let (mut sum, norms) = clipped_grad_sum(net, &ex, clip_run, cfg.per_sample)?;
        if let Some(wb) = hooks.white_box.as_deref() {
            let raw = GRADIENT_CANARY_NORM * cfg.clip;
            wb.inject(&mut sum, q_run, cfg.clip, clip_factor(raw, clip_run), &mut rng)?;
        }
        // Gaussian noise and averaging (line 13), Adam (line 14).
        let mut store = GradStore::default();
        let mut released = release_with(&sum, std, expected_batch, &mut noise_rng, defect)?;
        if let Some(wb) = hooks.white_box.as_deref_mut() {
            wb.observe(&released, expected_batch / cfg.clip)?;
        }
        for (name, var) in &net.params.vars {
            let g = released
                .remove(name)
                .ok_or_else(|| Error::model(format!("no gradient for `{name}`")))?;
            store.insert(var.as_tensor(), g);
        }
        opt.step(&store)?;
        ema.update(net)?;
        ledger.push(step_event.clone());
        if !norms.is_empty() {
            acc += norms.iter().sum::<f64>() / norms.len() as f64;
            acc_n += 1;
        }
        if step % log_every == 0 || step == cfg.steps as usize {
            log.losses
                .push((step, if acc_n > 0 { acc / acc_n as f64 } else { f64::NAN }));
            if let Some(bar) = bar {
                bar.set_message(format!("mean ‖g‖ {:.3}", acc / acc_n.max(1) as f64));
            }
            acc = 0.0;
            acc_n = 0;
        }
        if let Some(bar) = bar {
            bar.inc(1);
        }
    }
    ema.apply(net)?;
    let after = eval(net)?;
    Ok(DpRun {
        log,
        eval: before.zip(after),
        event: ledger.build(),
        mean_batch: total_batch as f64 / cfg.steps as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::schedule::table::TrainingScheduleConfig;
    use crate::events::EventFile;
    use crate::models::dp::{ledger_toml, release};
    use crate::models::toy::{Arch, ModelConfig};
    use candle_core::Device;

    fn setup(arch: Arch) -> (Net, TrainingSchedule, Examples) {
        let sched = TrainingSchedule::new(TrainingScheduleConfig::default()).unwrap();
        let cfg = ModelConfig {
            arch,
            hidden: 32,
            depth: 2,
            time_dim: 16,
            channels: 8,
        };
        let net = Net::new(&cfg, 11, &Device::Cpu).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let n = 9;
        let x0: Vec<f32> = normals(&mut rng, n * PIXELS).iter().map(|v| v.tanh()).collect();
        let t: Vec<usize> = (0..n).map(|i| 50 + 100 * i).collect();
        let eps = normals(&mut rng, n * PIXELS);
        let xt = noisy(&sched, &x0, &t, &eps);
        (net, sched, Examples { xt, t, eps })
    }

    /// The one-pass clipped sum equals the per-sample loop (the reference), with some samples
    /// clipped and some not.
    #[test]
    fn ghost_clipping_matches_per_sample_loop() {
        let (net, _s, ex) = setup(Arch::Mlp);
        let (_, norms) = clipped_grad_sum(&net, &ex, 1e9, PerSample::Loop).unwrap();
        let mut sorted = norms.clone();
        sorted.sort_by(f64::total_cmp);
        let clip = sorted[norms.len() / 2]; // about half the samples get clipped
        let (a, na) = clipped_grad_sum(&net, &ex, clip, PerSample::Ghost).unwrap();
        let (b, nb) = clipped_grad_sum(&net, &ex, clip, PerSample::Loop).unwrap();
        for (x, y) in na.iter().zip(&nb) {
            assert!((x - y).abs() <= 1e-4 * y.max(1e-3), "norm {x} vs {y}");
        }
        assert_eq!(a.len(), b.len());
        for (k, ga) in &a {
            let gb = &b[k];
            let diff = (ga - gb)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            let scale = gb.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff <= 1e-4 * scale.max(1e-6), "{k}: {diff} vs {scale}");
        }
        // Every clipped per-sample gradient has norm ≤ C, so the sum has norm ≤ n·C.
        let total: f32 = a
            .values()
            .map(|g| g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap())
            .sum();
        assert!((total as f64).sqrt() <= ex.len() as f64 * clip * (1.0 + 1e-5));
    }

    #[test]
    fn unet_uses_the_loop_and_rejects_ghost() {
        let (net, _s, ex) = setup(Arch::Unet);
        assert!(clipped_grad_sum(&net, &ex, 1.0, PerSample::Ghost).is_err());
        let (g, norms) = clipped_grad_sum(&net, &ex, 0.5, PerSample::Auto).unwrap();
        assert_eq!(norms.len(), ex.len());
        assert_eq!(g.len(), net.params.vars.len());
    }

    #[test]
    fn dp_run_records_its_event() {
        let (net, sched, _) = setup(Arch::Mlp);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let x0 = normals(&mut rng, 20 * PIXELS);
        let cfg = DpConfig {
            noise_multiplier: 1.3,
            clip: 1.0,
            sample_rate: 0.25,
            steps: 7,
            lr: 1e-3,
            ema_decay: 0.9,
            seed: Some(1),
            delta: 1e-5,
            t_min: 0,
            t_max: 999,
            per_sample: PerSample::Auto,
        };
        let run = dp_train(&net, &sched, &x0, &cfg, None, None, None).unwrap();
        assert_eq!(run.event, DpEvent::dpsgd(1.3, 0.25, 7));
        let text = ledger_toml(&run.event, 1e-5, "test").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.toml");
        std::fs::write(&p, text).unwrap();
        let f = EventFile::load(&p).unwrap();
        assert_eq!(f.event, cfg.event());
        assert_eq!(f.delta, Some(1e-5));
    }

    /// The released update of one batch is (Σ clipped gradients + N(0, σ²C²))/B: for a fixed
    /// gradient sum, over many draws each coordinate has mean sum/B and standard deviation σC/B.
    /// Fails if the noise is dropped (std 0) or mis-scaled (e.g. σ instead of σC, or not
    /// divided by B).
    #[test]
    fn released_update_has_the_dp_sgd_noise_distribution() {
        let (net, _s, ex) = setup(Arch::Mlp);
        let (clip, sigma, b) = (0.7, 1.3, 4.0);
        let (sum, _) = clipped_grad_sum(&net, &ex, clip, PerSample::Ghost).unwrap();
        let name = "output.weight".to_string();
        let name = if sum.contains_key(&name) {
            name
        } else {
            sum.keys().next().unwrap().clone()
        };
        let base: Vec<f32> = sum[&name].flatten_all().unwrap().to_vec1().unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(77);
        let reps = 400;
        let (mut m1, mut m2) = (vec![0.0f64; base.len()], vec![0.0f64; base.len()]);
        for _ in 0..reps {
            let r = release(&sum, sigma * clip, b, &mut rng).unwrap();
            let v: Vec<f32> = r[&name].flatten_all().unwrap().to_vec1().unwrap();
            for (j, x) in v.iter().enumerate() {
                let d = *x as f64 - base[j] as f64 / b;
                m1[j] += d;
                m2[j] += d * d;
            }
        }
        let count = (reps * base.len()) as f64;
        let mean = m1.iter().sum::<f64>() / count;
        let sd = (m2.iter().sum::<f64>() / count).sqrt();
        let want = sigma * clip / b;
        // count ≥ 400·32 draws: the sample sd is within 2% of the truth, the mean within 4 SE.
        assert!((sd / want - 1.0).abs() < 0.02, "sd {sd} vs σC/B = {want}");
        assert!(mean.abs() < 4.0 * want / count.sqrt(), "mean {mean}");
        // Zero noise releases exactly sum/B: the statistic above would be 0.
        let r = release(&sum, 0.0, b, &mut rng).unwrap();
        let v: Vec<f32> = r[&name].flatten_all().unwrap().to_vec1().unwrap();
        assert!(v
            .iter()
            .zip(&base)
            .all(|(x, y)| (*x as f64 - *y as f64 / b).abs() < 1e-6));
    }

    /// Without a seed the noise comes from the OS: two runs differ; with a seed they agree.
    #[test]
    fn unseeded_dp_runs_differ_and_seeded_runs_agree() {
        let (_, sched, _) = setup(Arch::Mlp);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let x0 = normals(&mut rng, 12 * PIXELS);
        let weights = |seed: Option<u64>| -> Vec<f32> {
            let (net, _, _) = setup(Arch::Mlp);
            let cfg = DpConfig {
                noise_multiplier: 1.0,
                clip: 1.0,
                sample_rate: 0.5,
                steps: 3,
                lr: 1e-3,
                ema_decay: 0.0,
                seed,
                delta: 1e-5,
                t_min: 0,
                t_max: 999,
                per_sample: PerSample::Auto,
            };
            dp_train(&net, &sched, &x0, &cfg, None, None, None).unwrap();
            net.params
                .vars
                .values()
                .flat_map(|v| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect()
        };
        assert_ne!(weights(None), weights(None));
        assert_eq!(weights(Some(5)), weights(Some(5)));
    }
}
