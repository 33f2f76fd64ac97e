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
//! normalisation; we leave the accounting to the accountants). The loop itself — sampling, noise,
//! Adam, the ledger built step by step — is the orchestrator's ([`crate::models::train::dp_sgd`]);
//! this file has the per-sample clipped gradients and RAPID's retrieval.
//!
//! RAPID's retrieval variant ([`KnowledgeBase`], §3.3–3.4): the model is first pretrained on
//! public rows; a knowledge base stores, for other public rows, key = features of x_k and
//! value = x_v on the same forward trajectory (k > v). For a private x, x_k ~ q(x_k | x) is the
//! query; the nearest key's value x̂_v gives the noise target ε̂ = (x̂_v − √ᾱ_v x)/√(1−ᾱ_v), and the
//! model is fine-tuned only on steps v' ≤ v with x_{v'} = √ᾱ_{v'} x + √(1−ᾱ_{v'}) ε̂ (Eq. 5, with
//! the squared norm). Simplification, stated: the feature extractor h is the pretrained model's
//! one-step denoised x̂₀ (no contrastive training of h, Alg. 1).

use std::collections::HashMap;

use candle_core::{Tensor, D};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

use crate::error::{Error, Result};

use super::net::Probe;
use super::{Net, PIXELS};
use crate::diffusion::schedule::table::{noisy, TrainingSchedule};
use crate::models::dp::normals;
pub use crate::models::train::{Examples, PerSample};

/// The tensors of the examples `rows` on the net's device: (x_t, t as f32, ε).
fn tensors(ex: &Examples, net: &Net, rows: std::ops::Range<usize>) -> Result<(Tensor, Tensor, Tensor)> {
    let n = rows.len();
    let dev = net.device();
    let px = rows.start * PIXELS..rows.end * PIXELS;
    Ok((
        Tensor::from_slice(&ex.xt[px.clone()], (n, PIXELS), dev)?,
        Tensor::from_vec(ex.t[rows].iter().map(|&v| v as f32).collect::<Vec<_>>(), n, dev)?,
        Tensor::from_slice(&ex.eps[px], (n, PIXELS), dev)?,
    ))
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
    let (xt, t, eps) = tensors(ex, net, 0..ex.len())?;
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
        let (xt, t, eps) = tensors(ex, net, i..i + 1)?;
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

/// Retrieval context for RAPID fine-tuning: the knowledge base and the frozen pretrained model.
pub struct Retrieval {
    /// RAPID's knowledge base.
    pub kb: KnowledgeBase,
    /// The frozen pretrained model.
    pub pretrained: Net,
}

impl Retrieval {
    /// The examples of the Poisson batch `x0` (Eq. 5): the query x_k ~ q(x_k | x) with features
    /// by the pretrained model, the nearest key's value x̂_v as the noise target
    /// ε̂ = (x̂_v − √ᾱ_v x)/√(1−ᾱ_v), and t ~ U{t.0..=min(t.1, v)}.
    pub fn examples(
        &self,
        schedule: &TrainingSchedule,
        x0: &[f32],
        t_range: (usize, usize),
        rng: &mut ChaCha20Rng,
    ) -> Result<Examples> {
        let n = x0.len() / PIXELS;
        let (k, v) = (self.kb.k, self.kb.v);
        let e = normals(rng, n * PIXELS);
        let xk = noisy(schedule, x0, &vec![k; n], &e);
        let feats = denoise_x0(&self.pretrained, schedule, &xk, k)?;
        let av = schedule.alpha_bars[v];
        let (sav, sbv) = (av.sqrt() as f32, (1.0 - av).sqrt() as f32);
        let mut eps = Vec::with_capacity(n * PIXELS);
        let mut t = Vec::with_capacity(n);
        for i in 0..n {
            let j = self.kb.nearest(&feats[i * PIXELS..(i + 1) * PIXELS]);
            let xv = &self.kb.values[j * PIXELS..(j + 1) * PIXELS];
            for p in 0..PIXELS {
                eps.push((xv[p] - sav * x0[i * PIXELS + p]) / sbv);
            }
            t.push(rng.random_range(t_range.0..=t_range.1.min(v)));
        }
        let xt = noisy(schedule, x0, &t, &eps);
        Ok(Examples { xt, t, eps })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::schedule::table::TrainingScheduleConfig;
    use crate::events::DpEvent;
    use crate::events::EventFile;
    use crate::models::dp::{ledger_toml, release};
    use crate::models::toy::{Arch, ModelConfig};
    use crate::models::train::{self, DpPlan, DpRun, DpSteps, Family, Hooks};
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

    /// `steps` DP-SGD steps (σ, q, C = 1) of `net` on `x0` through the orchestrator's loop.
    #[allow(clippy::too_many_arguments)]
    fn dp_steps(
        net: &Net,
        sched: TrainingSchedule,
        x0: &[f32],
        sigma: f64,
        q: f64,
        steps: usize,
        ema: f64,
        seed: Option<u64>,
    ) -> DpRun {
        let mut fam = crate::models::toy::run::ToyFamily::new(net.clone(), sched, PerSample::Auto, None);
        let vars: Vec<candle_core::Var> = fam.vars().into_iter().map(|(_, v)| v).collect();
        let mut opt = train::adam(vars.clone(), 1e-3).unwrap();
        let mut ema = train::Ema::new(vars, ema).unwrap();
        let s = DpSteps {
            dp: DpPlan {
                noise_multiplier: sigma,
                clip: 1.0,
                sample_rate: q,
                delta: 1e-5,
                per_sample: PerSample::Auto,
            },
            steps,
            t: (0, 999),
            seed,
            defect: None,
        };
        let run = train::dp_sgd(&mut fam, x0, &s, &mut opt, &mut ema, Hooks::default(), None).unwrap();
        ema.apply().unwrap();
        run
    }

    #[test]
    fn dp_run_records_its_event() {
        let (net, sched, _) = setup(Arch::Mlp);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let x0 = normals(&mut rng, 20 * PIXELS);
        let run = dp_steps(&net, sched, &x0, 1.3, 0.25, 7, 0.9, Some(1));
        let event = run.ledger.build();
        assert_eq!(event, DpEvent::dpsgd(1.3, 0.25, 7));
        let text = ledger_toml(&event, 1e-5, "test").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.toml");
        std::fs::write(&p, text).unwrap();
        let f = EventFile::load(&p).unwrap();
        assert_eq!(f.event, DpEvent::dpsgd(1.3, 0.25, 7));
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
            dp_steps(&net, sched.clone(), &x0, 1.0, 0.5, 3, 0.0, seed);
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
