//! `model info`: what a diffusers checkpoint folder holds (architecture, parameter count, file
//! hashes, scheduler), as the terminal text and the shared [`Report`] (one fact per line);
//! `model eval` (the UNet's raw output on a batch, to check against PyTorch) and `model grads`
//! (per-sample gradients of the ε-prediction loss), each from a request the CLI fills in.

use std::path::{Path, PathBuf};

use crate::data::npy;
use crate::error::{Error, Result};
use crate::models::diffusers::DiffusersCheckpoint;
use crate::models::precision::Precision;
use crate::models::{device, DeviceChoice};
use crate::report::{self, Report};

/// `model keygen`: a new Ed25519 key pair in `out` (created when missing; existing key files are
/// never replaced). Returns the files written.
pub fn keygen(out: &Path) -> Result<Vec<std::path::PathBuf>> {
    crate::provenance::write_key_pair(out)
}

/// Loads the checkpoint at `dir` (on the CPU) and describes it.
pub fn info(dir: &Path) -> Result<super::Outcome> {
    let ck = DiffusersCheckpoint::load(dir, &candle_core::Device::Cpu)?;
    let mut text = ck.info();
    text.push_str(&dp_line(&ck)?);
    let mut r =
        Report::new(format!("dpaudit model info: {}", dir.display()), report::command_line()).for_command("model");
    for (role, p) in crate::models::diffusers_train::folder_files(dir) {
        r.add_input(role, &p)?;
    }
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            r.fact(k.trim(), v.trim());
        }
    }
    r.conclude();
    Ok(super::Outcome::new(r, text))
}

/// The folder's DP line: the settings and the ε its card records (with the ledger that supports
/// it and its SHA-256), that it was trained without DP, or that no dpaudit card says either.
fn dp_line(ck: &DiffusersCheckpoint) -> Result<String> {
    use crate::models::diffusers_train::{UnetCard, CARD, LEDGER};
    use crate::report::export::fmt_num as f;
    let dir = ck.config_path.parent().unwrap_or(&ck.dir);
    let Some(card) = UnetCard::load(dir)? else {
        return Ok(format!(
            "DP: not recorded (no {CARD}: trained outside dpaudit; nothing here states a DP guarantee)\n"
        ));
    };
    let Some(dp) = card.dp else {
        return Ok("DP: none (the card records a training without DP: no privacy guarantee)\n".into());
    };
    let eps = match (dp.epsilon, dp.epsilon_accountant.as_deref()) {
        (Some(e), Some(a)) => format!("ε = {} at δ = {}, {a} as the card records", f(e), f(dp.delta)),
        (Some(e), None) => format!("ε = {} at δ = {} (as the card records)", f(e), f(dp.delta)),
        _ => format!("δ = {}, ε not recorded", f(dp.delta)),
    };
    let ledger = dir.join(LEDGER);
    let sha = if ledger.is_file() {
        crate::data::digits::sha256_file(&ledger)?
    } else {
        "missing".into()
    };
    Ok(format!(
        "DP: DP-SGD with noise multiplier {}, clip {}, sample rate {}, {} steps: {eps}; ledger {} sha256: {sha} (`dpaudit check {}` accounts it again)\n",
        f(dp.noise_multiplier),
        f(dp.clip),
        f(dp.sample_rate),
        dp.steps,
        dp.ledger,
        ck.dir.display()
    ))
}

/// `model eval`: the raw output of a diffusers UNet on a float32 batch.
#[derive(Debug, Clone)]
pub struct EvalRequest {
    /// The diffusers folder.
    pub checkpoint: PathBuf,
    /// float32 .npy (B, C, H, W).
    pub input: PathBuf,
    /// int64 (or int32, or float32) .npy (B,).
    pub timesteps: PathBuf,
    /// Output .npy.
    pub out: PathBuf,
    /// Replace an existing output.
    pub force: bool,
    /// Images per forward pass (≥ 1).
    pub batch: usize,
    /// The backend: the device the model runs on.
    pub device: DeviceChoice,
    /// The arithmetic of the forward on a GPU.
    pub precision: Precision,
}

/// Runs `model eval`: checks the inputs (shapes, finite values, timesteps ≥ 0), runs the UNet at
/// the request's backend and precision, writes float32 (B, C_out, H, W). Returns a note for
/// stderr.
pub fn eval(e: &EvalRequest) -> Result<String> {
    if e.batch == 0 {
        return Err(Error::field("--batch", "must be ≥ 1"));
    }
    crate::report::output::check_file(&e.out, e.force).map_err(|err| err.with_field("--out"))?;
    let dev = device::select(e.device)?;
    crate::models::precision::check_device(e.precision, &dev)?;
    let mut ck = DiffusersCheckpoint::load(&e.checkpoint, &dev)?;
    ck.precision = e.precision;
    let (shape, xs) = f32_batch(&e.input)?;
    let t = npy::read(&e.timesteps)?;
    let ts: Vec<f64> = match (t.to_i64(), t.to_f32()) {
        (Some(v), _) => {
            if let Some(bad) = v.iter().find(|&&s| s < 0) {
                return Err(Error::input(format!("negative timestep {bad}")).with_file(&e.timesteps));
            }
            v.iter().map(|&s| s as f64).collect()
        }
        (None, Some(v)) => {
            all_finite(&v, &e.timesteps)?;
            v.iter().map(|&s| s as f64).collect()
        }
        _ => {
            return Err(
                Error::input(format!("element type {} (expected int64 <i8)", t.dtype.descr())).with_file(&e.timesteps),
            )
        }
    };
    if t.shape != [shape[0]] {
        return Err(Error::input(format!(
            "shape {:?}, expected ({},) — one timestep per input image",
            t.shape, shape[0]
        ))
        .with_file(&e.timesteps));
    }
    let shape = [shape[0], shape[1], shape[2], shape[3]];
    let y = ck
        .eval(&xs, shape, &ts, e.batch)
        .map_err(|err| err.with_file(&e.input))?;
    let out_shape = [shape[0], ck.model.config.out_channels, shape[2], shape[3]];
    crate::report::output::write_atomic(&e.out, &npy::encode_f32(&out_shape, &y), e.force)?;
    Ok(format!(
        "wrote {} ({}×{}×{}×{} float32)",
        e.out.display(),
        out_shape[0],
        out_shape[1],
        out_shape[2],
        out_shape[3]
    ))
}

/// `model grads`: per-sample gradients of the ε-prediction loss of a diffusers UNet on a batch.
#[derive(Debug, Clone)]
pub struct GradsRequest {
    /// The diffusers folder.
    pub checkpoint: PathBuf,
    /// float32 .npy of x_t (B, C, H, W).
    pub input: PathBuf,
    /// int64 or float32 .npy (B,).
    pub timesteps: PathBuf,
    /// float32 .npy of ε (B, C, H, W).
    pub noise: PathBuf,
    /// Clip norm C of the clipped sum (None: norms only).
    pub clip: Option<f64>,
    /// Output folder.
    pub out: PathBuf,
    /// One backward pass per sample (the reference).
    pub per_sample_loop: bool,
    /// The hand-written CPU pass of one sample at a time.
    pub hand_written: bool,
    /// Replace existing outputs.
    pub force: bool,
}

/// Runs `model grads`: writes `norms.npy` (each sample's gradient norm) and, with a clip norm,
/// `clipped_sum.safetensors` = Σᵢ min(1, C/(‖gᵢ‖ + 1e-6)) gᵢ (Abadi et al. 2016, Alg. 1, the
/// sum DP-SGD adds noise to). Returns a note for stderr.
pub fn grads(g: &GradsRequest) -> Result<String> {
    use crate::models::unet2d::train::{clip_and_sum, per_sample_norms, TrainUnet};
    for f in ["norms.npy", "clipped_sum.safetensors"] {
        crate::report::output::check_file(&g.out.join(f), g.force).map_err(|e| e.with_field("--out"))?;
    }
    if let Some(c) = g.clip {
        if !(c > 0.0 && c.is_finite()) {
            return Err(Error::field("--clip", "must be a finite number > 0"));
        }
    }
    let dev = candle_core::Device::Cpu;
    let dir = crate::models::diffusers::unet_dir(&g.checkpoint).ok_or_else(|| {
        Error::input("not a diffusers checkpoint (no config.json, nor unet/config.json)").with_file(&g.checkpoint)
    })?;
    let cpath = dir.join("config.json");
    let config = crate::models::unet2d::Unet2dConfig::parse(&crate::input::read_to_string(&cpath)?, &cpath)?;
    let wpath = dir.join(crate::models::diffusers::WEIGHTS);
    let (tensors, _, _) = crate::models::diffusers::read_weights(&wpath, &dev)?;
    let model = TrainUnet::from_tensors(&config, tensors, &wpath, &dev)?;
    let (shape, x) = f32_batch(&g.input)?;
    let (eshape, e) = f32_batch(&g.noise)?;
    if eshape != shape {
        return Err(Error::input(format!("shape {eshape:?}, the input has {shape:?}")).with_file(&g.noise));
    }
    let t = npy::read(&g.timesteps)?;
    let ts: Vec<f64> = t
        .to_i64()
        .map(|v| v.iter().map(|&s| s as f64).collect())
        .or_else(|| t.to_f32().map(|v| v.iter().map(|&s| s as f64).collect()))
        .ok_or_else(|| Error::input("expected int64 or float32 timesteps").with_file(&g.timesteps))?;
    if ts.len() != shape[0] || ts.iter().any(|&s| s < 0.0) {
        return Err(
            Error::input(format!("expected {} timesteps ≥ 0, one per input image", shape[0])).with_file(&g.timesteps),
        );
    }
    let write_norms = |norms: &[f64]| -> Result<()> {
        std::fs::create_dir_all(&g.out).map_err(|err| Error::io(&g.out, &err))?;
        let nf: Vec<f32> = norms.iter().map(|&v| v as f32).collect();
        crate::report::output::write_atomic(&g.out.join("norms.npy"), &npy::encode_f32(&[nf.len()], &nf), g.force)
    };
    let save = |sum: &std::collections::HashMap<String, candle_core::Tensor>| -> Result<()> {
        let p = g.out.join("clipped_sum.safetensors");
        candle_core::safetensors::save(sum, &p).map_err(|err| Error::model(err.to_string()))
    };
    if g.hand_written {
        use crate::models::unet2d::grad_cpu::{unsupported, CpuGrad};
        if let Some(why) = unsupported(&config) {
            return Err(
                Error::field("--hand-written", format!("the hand-written pass does not cover {why}")).with_file(&cpath),
            );
        }
        let mut pass = CpuGrad::new(&model, [shape[1], shape[2], shape[3]]).map_err(|err| err.with_file(&g.input))?;
        let r = pass.clipped_sum(&x, &ts, &e, g.clip, 1.0)?;
        write_norms(&r.norms)?;
        if g.clip.is_some() {
            save(&pass.to_tensors(&r.sum, &dev)?)?;
        }
        return Ok(format!(
            "wrote per-sample gradient norms of {} samples to {} (hand-written CPU pass)",
            r.norms.len(),
            g.out.display()
        ));
    }
    let dims = (shape[0], shape[1], shape[2], shape[3]);
    let xt = candle_core::Tensor::from_vec(x, dims, &dev)?;
    let et = candle_core::Tensor::from_vec(e, dims, &dev)?;
    let per = if g.per_sample_loop {
        model.per_sample_grads_loop(&xt, &ts, &et)
    } else {
        model.per_sample_grads(&xt, &ts, &et)
    }
    .map_err(|err| err.with_file(&g.input))?;
    let norms = per_sample_norms(&per)?;
    write_norms(&norms)?;
    if let Some(c) = g.clip {
        let (sum, _) = clip_and_sum(&per, c)?;
        save(&sum)?;
    }
    Ok(format!(
        "wrote per-sample gradient norms of {} samples to {}",
        norms.len(),
        g.out.display()
    ))
}

/// A float32 (B, C, H, W) batch with finite values.
fn f32_batch(p: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let x = npy::read(p)?;
    let v = x
        .to_f32()
        .ok_or_else(|| Error::input(format!("element type {} (expected float32 <f4)", x.dtype.descr())).with_file(p))?;
    if x.shape.len() != 4 {
        return Err(Error::input(format!("shape {:?}, expected (B, C, H, W)", x.shape)).with_file(p));
    }
    all_finite(&v, p)?;
    Ok((x.shape.clone(), v))
}

/// Refuses a batch with a NaN or infinite value, naming the file and the first such element.
fn all_finite(v: &[f32], p: &Path) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::input(format!("element {i} is {}: a model input must be finite", v[i])).with_file(p)),
        None => Ok(()),
    }
}
