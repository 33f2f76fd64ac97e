//! HuggingFace diffusers checkpoints: a folder with `config.json` and
//! `diffusion_pytorch_model.safetensors` (a `UNet2DModel` saved with `save_pretrained`), or a
//! pipeline folder with `unet/` and `scheduler/` sub-folders; the `scheduler_config.json` beside
//! the UNet (or in `scheduler/`) gives the noise schedule and prediction type.
//!
//! Loading validates before building: every tensor must be floating point (F32, or F16/BF16
//! widened exactly to F32), finite, and exactly the name and shape the config implies, and no
//! tensor may be left over. Every failure is an input error (exit 2) naming the file and tensor.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::error::{Error, Result};

use super::precision::Precision;
use super::unet2d::{Unet2dConfig, Unet2dModel, WeightStore};
use crate::data::digits::{sha256_hex, sha256_hex_of};
use crate::diffusion::schedule::diffusers::{PredictionType, SchedulerConfig};
use crate::diffusion::schedule::table::TrainingSchedule;

pub use super::folder::{find_scheduler, unet_dir, WEIGHTS};

/// A loaded diffusers UNet with its scheduler.
pub struct DiffusersCheckpoint {
    /// The folder given by the user.
    pub dir: PathBuf,
    /// `config.json`.
    pub config_path: PathBuf,
    /// `diffusion_pytorch_model.safetensors`.
    pub weights_path: PathBuf,
    /// SHA-256 of `config.json`.
    pub config_sha256: String,
    /// SHA-256 of the weights file.
    pub weights_sha256: String,
    /// Number of tensors per stored dtype (e.g. `F32: 112`).
    pub stored_dtypes: BTreeMap<String, usize>,
    /// The model.
    pub model: Unet2dModel,
    /// `scheduler_config.json` and its content, when one was found.
    pub scheduler: Option<(PathBuf, SchedulerConfig)>,
    device: Device,
    /// The arithmetic of its forwards on a GPU: the plan's `--precision` (fp32 when loaded; the
    /// application layer sets it after [`super::precision::check_device`]).
    pub precision: Precision,
}

/// Tensors by name, the dtype count of the file, and its SHA-256.
pub type Weights = (HashMap<String, Tensor>, BTreeMap<String, usize>, String);

/// The safetensors format's largest header (its reference reader refuses more: 100 MB).
const MAX_HEADER: u64 = 100_000_000;

/// Where one tensor's f32 values are: a range of the file's data section read as f32 (a stored
/// F32 tensor at a 4-byte-aligned offset, on a little-endian host: no copy), or widened into a
/// buffer of their own (F16, BF16, or F32 at an unaligned offset).
enum Values {
    Shared(std::ops::Range<usize>),
    Own(Vec<f32>),
}

/// One tensor's values, or `Err((flat index, value))` of its first non-finite value. `data` is
/// the data section read into f32s, `bytes` the same memory as bytes (the section's length).
/// F16 and BF16 widen exactly (as candle's `to_dtype`); the header's validation has already
/// checked that each tensor's offsets hold shape × dtype size bytes inside the section.
fn tensor_values(
    info: &safetensors::tensor::TensorInfo,
    data: &[f32],
    bytes: &[u8],
) -> std::result::Result<Values, (usize, f32)> {
    use safetensors::Dtype;
    let first_bad = |v: &[f32]| v.iter().position(|x| !x.is_finite()).map(|i| (i, v[i]));
    let (s, e) = info.data_offsets;
    let raw = &bytes[s..e];
    let vals: Vec<f32> = match info.dtype {
        Dtype::F32 if cfg!(target_endian = "little") && s % 4 == 0 => {
            let r = s / 4..e / 4;
            return match first_bad(&data[r.clone()]) {
                Some(bad) => Err(bad),
                None => Ok(Values::Shared(r)),
            };
        }
        Dtype::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => raw
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        // BF16, the one other dtype `read_weights` lets through.
        _ => raw
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    };
    match first_bad(&vals) {
        Some(bad) => Err(bad),
        None => Ok(Values::Own(vals)),
    }
}

/// Reads and validates every tensor of a safetensors file (dtype, finiteness), widening F16/BF16
/// to F32. Errors name the file and the tensor (the first in name order when several are bad).
///
/// The header is read and validated first (the `safetensors` crate's own checks: contiguous
/// offsets, each tensor's byte count, the file's length); then the data section is read, in
/// parallel chunks, straight into one f32 buffer. The SHA-256 is of exactly the bytes read
/// (header, then data: the whole file), computed while the tensors are checked. On the CPU each
/// stored F32 tensor is a view of that one buffer (the checkpoint is in memory once, and no pass
/// copies it again); on a GPU each is copied to the device from it.
pub fn read_weights(path: &Path, device: &Device) -> Result<Weights> {
    use std::os::unix::fs::FileExt;
    /// Bytes per read.
    const CHUNK: usize = 8 << 20;
    let t0 = std::time::Instant::now();
    let io = |e: std::io::Error| Error::io(path, &e);
    let bad = |what: String| Error::input(format!("not a safetensors file: {what}")).with_file(path);
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    // Sized against the memory cap before anything is allocated (a sparse 1 TB file is an
    // input error, not an allocation failure).
    crate::limits::check("weights file size", len as f64, crate::limits::WEIGHTS_FILE_BYTE)
        .map_err(|e| e.with_file(path))?;
    if len < 8 {
        return Err(bad(format!("{len} bytes, shorter than the 8-byte header length")));
    }
    let mut n8 = [0u8; 8];
    f.read_exact_at(&mut n8, 0).map_err(io)?;
    let n = u64::from_le_bytes(n8);
    if n > MAX_HEADER || n > len - 8 {
        return Err(bad(format!(
            "header length {n} does not fit in the file's {len} bytes (or exceeds the format's {MAX_HEADER})"
        )));
    }
    let mut head = vec![0u8; 8 + n as usize];
    head[..8].copy_from_slice(&n8);
    f.read_exact_at(&mut head[8..], 8).map_err(io)?;
    let text = std::str::from_utf8(&head[8..]).map_err(|e| bad(format!("header is not UTF-8 ({e})")))?;
    let meta: safetensors::tensor::Metadata = serde_json::from_str(text).map_err(|e| bad(format!("header: {e}")))?;
    let data_len = meta.data_len();
    if (data_len as u64).checked_add(8 + n) != Some(len) {
        return Err(bad(format!(
            "the header describes {data_len} bytes of data, the file holds {}",
            len - 8 - n
        )));
    }
    let mut data = vec![0f32; data_len.div_ceil(4)];
    bytemuck::cast_slice_mut::<f32, u8>(&mut data)[..data_len]
        .par_chunks_mut(CHUNK)
        .enumerate()
        .try_for_each(|(i, c)| f.read_exact_at(c, 8 + n + (i * CHUNK) as u64))
        .map_err(io)?;
    if f.metadata().map_err(io)?.len() != len {
        return Err(Error::input(
            "the file changed size while it was read (is it still being written?); run again once it is complete",
        )
        .with_file(path));
    }
    crate::timing::note("load checkpoint: read weights", t0);

    let t0 = std::time::Instant::now();
    let mut infos: Vec<_> = meta.tensors().into_iter().collect();
    infos.sort_by(|a, b| a.0.cmp(&b.0));
    let mut dtypes = BTreeMap::new();
    for (name, info) in &infos {
        let dt = format!("{:?}", info.dtype);
        *dtypes.entry(dt.clone()).or_insert(0) += 1;
        if !matches!(dt.as_str(), "F32" | "F16" | "BF16") {
            return Err(Error::input(format!(
                "tensor `{name}` has dtype {dt}; UNet weights must be floating point (F32, F16 or BF16) (wrong dtype)"
            ))
            .with_file(path));
        }
    }
    let bytes = &bytemuck::cast_slice::<f32, u8>(&data)[..data_len];
    let (sha, vals) = rayon::join(
        || sha256_hex_of(&[&head, bytes]),
        || {
            infos
                .par_iter()
                .map(|(_, info)| tensor_values(info, &data, bytes))
                .collect::<Vec<_>>()
        },
    );
    crate::timing::note("load checkpoint: sha256 and host tensors", t0);

    let t0 = std::time::Instant::now();
    let tensor_err = |name: &str, e: candle_core::Error| Error::input(format!("tensor `{name}`: {e}")).with_file(path);
    // On the CPU, the one buffer every stored F32 tensor is a view of.
    let whole = if device.is_cpu() {
        let count = data.len();
        Some(Tensor::from_vec(std::mem::take(&mut data), count, device).map_err(|e| tensor_err("(data)", e))?)
    } else {
        None
    };
    let mut map = HashMap::with_capacity(infos.len());
    for ((name, info), v) in infos.iter().zip(vals) {
        let shape = info.shape.clone();
        let t = match v {
            Err((i, x)) => {
                return Err(Error::input(format!(
                    "tensor `{name}` holds a non-finite value ({x} at flat index {i}): NaN/inf weights"
                ))
                .with_file(path))
            }
            Ok(Values::Shared(r)) => match &whole {
                Some(w) => w.narrow(0, r.start, r.len()).and_then(|t| t.reshape(shape)),
                None => Tensor::from_slice(&data[r], shape, device),
            },
            Ok(Values::Own(v)) => Tensor::from_vec(v, shape, device),
        }
        .map_err(|e| tensor_err(name, e))?;
        map.insert(name.clone(), t);
    }
    crate::timing::note("load checkpoint: tensors to the device", t0);
    Ok((map, dtypes, sha))
}

impl DiffusersCheckpoint {
    /// Loads a diffusers checkpoint folder onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let udir = unet_dir(dir).ok_or_else(|| {
            Error::input(format!(
                "{} is not a diffusers checkpoint (no config.json, nor unet/config.json)",
                dir.display()
            ))
            .with_file(dir)
        })?;
        let config_path = udir.join("config.json");
        let text = crate::input::read_to_string(&config_path)?;
        let config_sha256 = sha256_hex(text.as_bytes());
        let config = Unet2dConfig::parse(&text, &config_path)?;
        let weights_path = udir.join(WEIGHTS);
        if !weights_path.is_file() {
            let bin = udir.join("diffusion_pytorch_model.bin");
            let msg = if bin.is_file() {
                format!(
                    "{WEIGHTS} not found (only a pickled .bin is there; dpaudit reads safetensors: re-save with save_pretrained(..., safe_serialization=True))"
                )
            } else {
                format!("{WEIGHTS} not found next to config.json")
            };
            return Err(Error::input(msg).with_file(&weights_path));
        }
        let (tensors, stored_dtypes, weights_sha256) = read_weights(&weights_path, device)?;
        let t0 = std::time::Instant::now();
        let store = WeightStore::new(tensors, &weights_path);
        let model = Unet2dModel::new(&config, &store)?;
        crate::timing::note("load checkpoint: model", t0);
        let scheduler = match find_scheduler(&udir, dir) {
            Some(p) => {
                let s = SchedulerConfig::load(&p)?;
                Some((p, s))
            }
            None => None,
        };
        Ok(DiffusersCheckpoint {
            dir: dir.to_path_buf(),
            config_path,
            weights_path,
            config_sha256,
            weights_sha256,
            stored_dtypes,
            model,
            scheduler,
            device: device.clone(),
            precision: Precision::Fp32,
        })
    }

    /// The raw model output for a batch (B, C, H, W) given flat, at timesteps `t`, computed in
    /// chunks of `batch` rows, at the checkpoint's [`DiffusersCheckpoint::precision`].
    pub fn eval(&self, x: &[f32], shape: [usize; 4], t: &[f64], batch: usize) -> Result<Vec<f32>> {
        self.eval_at(x, shape, t, batch, self.precision)
    }

    /// [`DiffusersCheckpoint::eval`] at precision `precision`.
    pub fn eval_at(
        &self,
        x: &[f32],
        shape: [usize; 4],
        t: &[f64],
        batch: usize,
        precision: Precision,
    ) -> Result<Vec<f32>> {
        let [b, c, h, w] = shape;
        let per = c * h * w;
        if x.len() != b * per || t.len() != b {
            return Err(Error::input(format!(
                "batch of {b} images of {c}×{h}×{w} needs {} values and {b} timesteps, got {} and {}",
                b * per,
                x.len(),
                t.len()
            )));
        }
        let per_out = h * w * self.model.config.out_channels;
        let mut out = Vec::with_capacity(b * per_out);
        for win in batch_windows(b, batch) {
            let (start, n) = (win.start, win.len);
            let y = self.model.forward_host_at(
                &x[start * per..(start + n) * per],
                [n, c, h, w],
                &t[start..start + n],
                precision,
            )?;
            out.extend_from_slice(&y[win.skip * per_out..]);
        }
        Ok(out)
    }

    /// The executor its forward runs on at the checkpoint's precision
    /// ([`super::unet2d::Unet2dModel::executor`]).
    pub fn executor(&self) -> &'static str {
        self.model.executor(self.precision)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Images per forward pass that fit the free memory of the checkpoint's GPU for images of
    /// `shape` at `precision` ([`super::precision::fit_batch`]), with the free bytes; `None` on
    /// the CPU or when the free memory cannot be read.
    pub fn fit_batch(&self, shape: [usize; 3], precision: super::precision::Precision) -> Option<(usize, u64)> {
        let (free, _) = super::precision::device_memory(&self.device)?;
        let (feature, skips, attn) = self.model.config.activation_values(shape[1], shape[2]);
        let bytes = if precision == super::precision::Precision::Bf16 {
            2
        } else {
            4
        };
        Some((super::precision::fit_batch(free, bytes, feature, skips, attn), free))
    }

    /// Multi-line description for `dpaudit model info`.
    pub fn info(&self) -> String {
        let c = &self.model.config;
        let mut s = String::new();
        s.push_str(&format!("checkpoint: {}\n", self.dir.display()));
        s.push_str(&format!("architecture: {}\n", c.describe()));
        if let Some((h, w)) = c.sample_size {
            s.push_str(&format!("sample_size: {h}×{w}\n"));
        }
        s.push_str(&format!("parameters: {}\n", self.model.parameters));
        let ex: Vec<String> = super::unet2d::executors(c)
            .into_iter()
            .map(|(name, why)| match why {
                None => format!("{name} yes"),
                Some(w) => format!("{name} no: {w}"),
            })
            .collect();
        s.push_str(&format!("executors: {}\n", ex.join("; ")));
        let dts: Vec<String> = self.stored_dtypes.iter().map(|(k, v)| format!("{k} × {v}")).collect();
        s.push_str(&format!("stored dtypes: {}\n", dts.join(", ")));
        s.push_str(&format!("config.json sha256: {}\n", self.config_sha256));
        s.push_str(&format!("{WEIGHTS} sha256: {}\n", self.weights_sha256));
        if !c.defaulted.is_empty() {
            s.push_str(&format!(
                "config keys defaulted as diffusers does: {}\n",
                c.defaulted.join(", ")
            ));
        }
        match &self.scheduler {
            Some((p, sc)) => s.push_str(&format!(
                "scheduler: {} ({}): T = {}, β {} {}..{}, prediction_type {}, clip_sample {}, timestep_spacing {:?}\n",
                p.display(),
                sc.class_name,
                sc.num_train_timesteps,
                sc.beta_schedule_name(),
                sc.beta_start,
                sc.beta_end,
                sc.prediction_type.as_str(),
                sc.clip_sample,
                sc.timestep_spacing
            )),
            None => s.push_str("scheduler: none found (attacks need scheduler_config.json)\n"),
        }
        s
    }

    /// The checkpoint as an ε-predictor for attacks (needs a scheduler), on images of `shape`.
    pub fn denoiser(&self, shape: [usize; 3], batch: usize) -> Result<DiffusersDenoiser<'_>> {
        let (p, sc) = self.scheduler.as_ref().ok_or_else(|| {
            Error::input("no scheduler_config.json beside the UNet (or in scheduler/): the noise schedule is unknown")
                .with_file(&self.dir)
        })?;
        if shape[0] != self.model.config.in_channels || self.model.config.out_channels != shape[0] {
            return Err(Error::input(format!(
                "images have {} channels; the UNet maps {} to {} channels",
                shape[0], self.model.config.in_channels, self.model.config.out_channels
            ))
            .with_file(&self.config_path));
        }
        Ok(DiffusersDenoiser {
            ck: self,
            precision: self.precision,
            schedule: sc.schedule(p)?,
            prediction: sc.prediction_type,
            shape,
            batch,
        })
    }
}

/// One forward of [`batch_windows`]: rows `start..start + len`, of which the first `skip` were
/// already computed by the previous window (their outputs are dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchWindow {
    /// First row of the forward.
    pub start: usize,
    /// Rows in the forward.
    pub len: usize,
    /// Leading rows whose outputs the previous window gave.
    pub skip: usize,
}

/// The forwards that compute `n` rows in batches of at most `batch`, all of one size: the
/// fewest batches, k = ⌈n / batch⌉, of s = ⌈n / k⌉ rows each, the last one ending at row n
/// (so it may overlap the one before by k·s − n < k rows, recomputed and dropped). The UNet
/// treats rows independently, so the outputs are those of any other batching (on the CPU bit
/// for bit; on a GPU up to the rounding of the algorithm cuDNN picks for a shape); one batch shape
/// per call means a GPU meets one set of convolution shapes (cuDNN's algorithm choice, kernel
/// loading) instead of a second set for a short last batch.
pub fn batch_windows(n: usize, batch: usize) -> Vec<BatchWindow> {
    if n == 0 {
        return Vec::new();
    }
    let k = n.div_ceil(batch.max(1));
    let s = n.div_ceil(k);
    (0..k)
        .map(|i| {
            let first = i * s;
            let start = first.min(n - s);
            BatchWindow {
                start,
                len: s,
                skip: first - start,
            }
        })
        .collect()
}

/// A diffusers UNet as an ε-predictor: batched, with v / x₀ predictions converted to ε.
#[derive(Clone)]
pub struct DiffusersDenoiser<'a> {
    ck: &'a DiffusersCheckpoint,
    /// The arithmetic of its forwards on a GPU.
    precision: Precision,
    /// ᾱ table from the scheduler config.
    pub schedule: TrainingSchedule,
    prediction: PredictionType,
    shape: [usize; 3],
    batch: usize,
}

impl DiffusersDenoiser<'_> {
    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.ck.device
    }

    /// Images per forward pass.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The UNet.
    pub fn model(&self) -> &super::unet2d::Unet2dModel {
        &self.ck.model
    }

    /// The arithmetic of its forwards on a GPU.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The same denoiser computing at `precision` (e.g. fp32 again, to measure what tf32 or bf16
    /// changed): same weights, same schedule.
    pub fn at_precision(&self, precision: Precision) -> DiffusersDenoiser<'_> {
        DiffusersDenoiser {
            precision,
            ..self.clone()
        }
    }

    /// ε̂ for a device-resident batch `x` [n, C·H·W] (f32, on the model's device) at step `t`
    /// for every row, in forwards of at most `batch` images; returns [n, C·H·W] f32 on the
    /// device. v- and x₀-predictions are converted to ε as [`PredictionType::to_eps`] does (in
    /// f64 on the device).
    pub fn predict_eps_tensor(&self, x: &Tensor, t: usize) -> Result<Tensor> {
        let [c, h, w] = self.shape;
        let (n, d) = x.dims2()?;
        if d != c * h * w {
            return Err(Error::input(format!(
                "{d} values per row, the images have {}",
                c * h * w
            )));
        }
        if t >= self.schedule.len() {
            return Err(Error::input(format!("timestep {t} ≥ T = {}", self.schedule.len())));
        }
        let mut parts = Vec::with_capacity(n.div_ceil(self.batch.max(1)));
        for win in batch_windows(n, self.batch) {
            let m = win.len;
            let xb = x.narrow(0, win.start, m)?.reshape((m, c, h, w))?;
            let y = self
                .ck
                .model
                .forward_at(&xb, &vec![t as f64; m], self.precision)?
                .reshape((m, d))?;
            parts.push((y, win.skip));
        }
        let out = if parts.len() <= 1 {
            match parts.pop() {
                Some((y, _)) => y,
                None => Tensor::zeros((0, d), DType::F32, x.device())?,
            }
        } else if let Some(all) = self.ck.model.fused_gather(&parts, d)? {
            all
        } else {
            let kept = parts
                .iter()
                .map(|(y, skip)| y.narrow(0, *skip, y.dim(0)? - skip))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&kept, 0)?
        };
        let abar = self.schedule.alpha_bars[t];
        Ok(match self.prediction {
            PredictionType::Epsilon => out,
            PredictionType::VPrediction => {
                let (o, xt) = (out.to_dtype(DType::F64)?, x.to_dtype(DType::F64)?);
                ((o * abar.sqrt())? + (xt * (1.0 - abar).sqrt())?)?.to_dtype(DType::F32)?
            }
            PredictionType::Sample => {
                let (o, xt) = (out.to_dtype(DType::F64)?, x.to_dtype(DType::F64)?);
                ((xt - (o * abar.sqrt())?)? / (1.0 - abar).sqrt())?.to_dtype(DType::F32)?
            }
        })
    }
}

impl DiffusersDenoiser<'_> {
    /// (C, H, W) of one image.
    pub fn sample_shape(&self) -> [usize; 3] {
        self.shape
    }

    /// ε̂(x_t, t) on the host for `x` holding `t.len()` flat rows of C·H·W values, one step per
    /// row (batched by `batch`); v- and x₀-predictions are converted to ε (the attacks'
    /// `Denoiser` trait calls this).
    pub fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        let [c, h, w] = self.shape;
        let d = c * h * w;
        if let Some(&bad) = t.iter().find(|&&s| s >= self.schedule.len()) {
            return Err(Error::input(format!("timestep {bad} ≥ T = {}", self.schedule.len())));
        }
        let tf: Vec<f64> = t.iter().map(|&s| s as f64).collect();
        let mut out = self
            .ck
            .eval_at(x, [t.len(), c, h, w], &tf, self.batch, self.precision)?;
        if self.prediction != PredictionType::Epsilon {
            for (i, &s) in t.iter().enumerate() {
                let abar = self.schedule.alpha_bars[s];
                for j in i * d..(i + 1) * d {
                    out[j] = self.prediction.to_eps(out[j], x[j], abar);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file from its header text and data section.
    fn st_file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    /// An F32 tensor after an F16 one sits at an offset that is not a multiple of 4: it is
    /// decoded into its own buffer, equal to the stored values. F32 tensors at aligned offsets
    /// (views of the file's data, reshaped) read theirs too. The hash is the whole file's.
    #[test]
    fn f32_at_an_unaligned_offset_reads_its_stored_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let mut data = half::f16::from_f32(1.5).to_le_bytes().to_vec();
        for v in [2.25f32, -3.0, 4.5] {
            data.extend_from_slice(&v.to_le_bytes());
        }
        let header = r#"{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"F32","shape":[3],"data_offsets":[2,14]}}"#;
        let file = st_file(header, &data);
        std::fs::write(&path, &file).unwrap();
        let (got, _, sha) = read_weights(&path, &Device::Cpu).unwrap();
        assert_eq!(sha, sha256_hex(&file));
        assert_eq!(got["a"].to_vec1::<f32>().unwrap(), vec![1.5]);
        assert_eq!(got["b"].to_vec1::<f32>().unwrap(), vec![2.25, -3.0, 4.5]);
        // Aligned: a view into the one data buffer, reshaped.
        let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]}}"#;
        let data: Vec<u8> = [7.0f32, 8.0, 9.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&path, st_file(header, &data)).unwrap();
        let (got, _, _) = read_weights(&path, &Device::Cpu).unwrap();
        assert_eq!(got["b"].to_vec2::<f32>().unwrap(), vec![vec![8.0, 9.0]]);
    }

    /// Files whose header lies (length past the end, more or less data than described,
    /// offsets that overlap, not UTF-8, not JSON, too short) are input errors naming the file,
    /// never a panic.
    #[test]
    fn malformed_safetensors_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let ok = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let data = [0u8; 8];
        let mut lying = st_file(ok, &data);
        lying[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("too short", vec![1, 2, 3]),
            ("header length past the end", lying),
            ("less data than described", st_file(ok, &data[..4])),
            ("more data than described", st_file(ok, &[0u8; 12])),
            (
                "overlapping offsets",
                st_file(
                    r#"{"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                    &data,
                ),
            ),
            (
                "byte count against the shape",
                st_file(r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &data),
            ),
            (
                "not UTF-8",
                [&3u64.to_le_bytes()[..], &[b'{', 0xff, b'}'], &data].concat(),
            ),
            ("not JSON", st_file("{]", &data)),
            ("empty header", st_file("", &data)),
        ];
        for (what, bytes) in cases {
            std::fs::write(&path, &bytes).unwrap();
            let err = read_weights(&path, &Device::Cpu).unwrap_err().to_string();
            assert!(
                err.contains("not a safetensors file") && err.contains("w.safetensors"),
                "{what}: {err}"
            );
        }
    }

    /// Weights read on the host equal candle's own reading (F32 as stored, F16 and BF16 widened
    /// by `to_dtype`), the hash is the file's, and of two tensors with non-finite values the
    /// error names the first in name order with its flat index.
    #[test]
    fn weights_read_on_the_host_equal_candles_reading() {
        let dir = tempfile::tempdir().unwrap();
        let vals: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) * 0.37).collect();
        let base = Tensor::from_vec(vals, (2, 3, 4), &Device::Cpu).unwrap();
        let mut ts = HashMap::new();
        ts.insert("a.f32".to_string(), base.clone());
        ts.insert("b.f16".to_string(), base.to_dtype(DType::F16).unwrap());
        ts.insert("c.bf16".to_string(), base.to_dtype(DType::BF16).unwrap());
        ts.insert("d.scalar".to_string(), Tensor::new(2.5f32, &Device::Cpu).unwrap());
        let path = dir.path().join("w.safetensors");
        candle_core::safetensors::save(&ts, &path).unwrap();
        let (got, dtypes, sha) = read_weights(&path, &Device::Cpu).unwrap();
        assert_eq!(sha, sha256_hex(&std::fs::read(&path).unwrap()));
        assert_eq!(
            dtypes,
            BTreeMap::from([("BF16".into(), 1), ("F16".into(), 1), ("F32".into(), 2)])
        );
        for (name, t) in &ts {
            let want: Vec<f32> = t
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let g = &got[name];
            assert_eq!((g.dims(), g.dtype()), (t.dims(), DType::F32), "{name}");
            let g: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
            assert!(g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}");
        }
        let mut bad = ts.clone();
        let mut v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        v[7] = f32::NAN;
        bad.insert(
            "z.late".into(),
            Tensor::from_vec(v.clone(), (24,), &Device::Cpu).unwrap(),
        );
        v[7] = 0.0;
        v[13] = f32::INFINITY;
        bad.insert("m.early".into(), Tensor::from_vec(v, (24,), &Device::Cpu).unwrap());
        candle_core::safetensors::save(&bad, &path).unwrap();
        let err = read_weights(&path, &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("`m.early`") && err.contains("flat index 13"), "{err}");
    }

    #[test]
    fn batch_windows_cover_each_row_once_in_one_shape() {
        for batch in [1, 2, 3, 7, 64, 256] {
            for n in 0..600 {
                let ws = batch_windows(n, batch);
                assert_eq!(ws.len(), n.div_ceil(batch), "n {n} batch {batch}");
                let mut next = 0;
                for w in &ws {
                    assert_eq!(w.len, ws[0].len, "one shape: n {n} batch {batch}");
                    assert!(w.len <= batch && w.skip < w.len);
                    assert_eq!(w.start + w.skip, next, "rows in order, none twice: n {n} batch {batch}");
                    next = w.start + w.len;
                }
                assert_eq!(next, n, "every row: n {n} batch {batch}");
                let recomputed: usize = ws.iter().map(|w| w.skip).sum();
                assert!(recomputed < ws.len().max(1), "n {n} batch {batch}");
            }
        }
        // 10,000 images at 256: 40 forwards of 250 (not 39 of 256 and one of 16).
        let ws = batch_windows(10_000, 256);
        assert_eq!((ws.len(), ws[0].len, ws[39].skip), (40, 250, 0));
        // 1,001 at 256: 4 of 251, the last starting at row 750 (one row recomputed).
        let ws = batch_windows(1001, 256);
        assert_eq!(
            ws[3],
            BatchWindow {
                start: 750,
                len: 251,
                skip: 3
            }
        );
    }
}
