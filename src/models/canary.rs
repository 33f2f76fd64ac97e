//! Canaries for the one-run audit (Steinke, Nasr & Jagielski 2023, Algorithm 1): m records, each
//! included in the private training data independently with probability ½.
//!
//! dpaudit's canaries are random images with every value ±1 (far from the data, so a model that
//! trained on one remembers it, which makes the audit strong). Their contents may be public; the
//! inclusion bits are the secret the audit tests, so they are drawn from the operating system's
//! CSPRNG unless a seed is given. The file `<stem>.canaries.csv` (columns `id`, `included`,
//! `x0` … `x{d−1}`) is the auditor's record; the card names it with its SHA-256.

use std::path::Path;

use rand::{Rng, RngCore};

use crate::error::{Error, Result};

/// A set of canaries.
#[derive(Debug, Clone, PartialEq)]
pub struct Canaries {
    /// Identifiers ("canary-0", …).
    pub ids: Vec<String>,
    /// Contents, row-major [m, dim].
    pub rows: Vec<f32>,
    /// Values per canary.
    pub dim: usize,
    /// Included in training (the secret).
    pub included: Vec<bool>,
}

impl Canaries {
    /// `m` random ±1 canaries of `dim` values, each included with probability ½, all drawn from
    /// `rng` (pass a CSPRNG seeded by the OS for a real audit).
    pub fn generate(m: usize, dim: usize, rng: &mut dyn RngCore) -> Self {
        let mut rows = Vec::with_capacity(m * dim);
        let mut included = Vec::with_capacity(m);
        for _ in 0..m {
            for _ in 0..dim {
                rows.push(if rng.random::<bool>() { 1.0 } else { -1.0 });
            }
            included.push(rng.random::<bool>());
        }
        Canaries {
            ids: (0..m).map(|i| format!("canary-{i}")).collect(),
            rows,
            dim,
            included,
        }
    }

    /// Number of canaries.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The included canaries' rows (they join the private training data).
    pub fn included_rows(&self) -> Vec<f32> {
        self.rows
            .chunks_exact(self.dim)
            .zip(&self.included)
            .filter(|(_, &b)| b)
            .flat_map(|(r, _)| r.iter().copied())
            .collect()
    }

    /// The CSV text.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("id,included");
        for j in 0..self.dim {
            s.push_str(&format!(",x{j}"));
        }
        s.push('\n');
        for ((id, row), inc) in self
            .ids
            .iter()
            .zip(self.rows.chunks_exact(self.dim))
            .zip(&self.included)
        {
            s.push_str(&format!("{id},{}", u8::from(*inc)));
            for v in row {
                s.push_str(&format!(",{v}"));
            }
            s.push('\n');
        }
        s
    }

    /// Reads a canaries file; errors name the file and line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        let mut lines = text.lines();
        let header = lines
            .next()
            .ok_or_else(|| Error::input("empty canaries file").with_file(path))?;
        let dim = header.split(',').count().saturating_sub(2);
        if !header.starts_with("id,included") || dim == 0 {
            return Err(Error::input("expected the header `id,included,x0,…`")
                .with_file(path)
                .with_line(1));
        }
        let mut c = Canaries {
            ids: Vec::new(),
            rows: Vec::new(),
            dim,
            included: Vec::new(),
        };
        for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad = |m: String| Error::input(m).with_file(path).with_line(i + 2);
            let v: Vec<&str> = line.split(',').map(str::trim).collect();
            if v.len() != dim + 2 {
                return Err(bad(format!("expected {} values, got {}", dim + 2, v.len())));
            }
            c.ids.push(v[0].to_string());
            c.included.push(included_bit(v[1]).map_err(bad)?);
            for x in &v[2..] {
                let f: f32 = x
                    .parse()
                    .map_err(|_| bad(format!("{} is not a number", crate::error::token(x))))?;
                if !f.is_finite() {
                    return Err(bad(format!("`{x}` is not finite")));
                }
                c.rows.push(f);
            }
        }
        if c.len() < 2 {
            return Err(Error::input("a canaries file needs at least 2 canaries").with_file(path));
        }
        Ok(c)
    }

    /// The canaries a card's `info` names in `dir` (SHA-256 and count checked against the card
    /// at `card_path`).
    pub fn of_info(info: &super::card::CanaryInfo, dir: &Path, card_path: &Path) -> Result<Self> {
        let p = dir.join(&info.file);
        let sha = crate::data::digits::sha256_file(&p)?;
        if sha != info.sha256 {
            return Err(Error::field(
                "canaries.sha256",
                format!("{} has SHA-256 {sha}, the card says {}", p.display(), info.sha256),
            )
            .with_file(card_path));
        }
        let c = Self::load(&p)?;
        if c.len() != info.count {
            return Err(Error::field(
                "canaries.count",
                format!("the card says {}, {} has {}", info.count, p.display(), c.len()),
            )
            .with_file(card_path));
        }
        Ok(c)
    }
}

/// The `included` column of a canaries file: 1 or 0.
fn included_bit(v: &str) -> std::result::Result<bool, String> {
    match v {
        "1" => Ok(true),
        "0" => Ok(false),
        o => Err(format!("`included` must be 1 or 0, got {}", crate::error::token(o))),
    }
}

/// A gradient canary's per-sample gradient norm as a multiple of the clip bound C. A correct
/// trainer clips it to exactly C (so the canary costs what any record costs); a trainer that
/// skips clipping lets the whole 2C through, which the audit sees.
pub const GRADIENT_CANARY_NORM: f64 = 2.0;

pub use super::card::CanaryKind;

/// White-box gradient canaries (Nasr et al. 2023, Dirac canaries): canary i is a record whose
/// per-sample gradient is [`GRADIENT_CANARY_NORM`]·C·e_{j_i}, one distinct parameter
/// coordinate j_i each, so the canaries never overlap. Each is included in the private data
/// independently with probability ½ (the audit's secret) and, once included, is Poisson-sampled
/// like every private row, so the run's ledger is unchanged: it is a record of the dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct GradientCanaries {
    /// Identifiers ("canary-0", …).
    pub ids: Vec<String>,
    /// (parameter tensor name, flat index) of each canary's coordinate.
    pub coords: Vec<(String, usize)>,
    /// Included in training (the secret).
    pub included: Vec<bool>,
}

impl GradientCanaries {
    /// `m` canaries on distinct coordinates of the parameters `shapes` (name, element count):
    /// one in every tensor first (so a defect confined to some tensors is seen), the rest
    /// uniformly over the remaining coordinates; inclusion bits from `rng`.
    pub fn generate(m: usize, shapes: &[(String, usize)], rng: &mut dyn RngCore) -> Result<Self> {
        let total: usize = shapes.iter().map(|s| s.1).sum();
        if m > total {
            return Err(Error::field(
                "--canaries",
                format!("{m} gradient canaries need {m} distinct coordinates; the model has {total} parameters"),
            ));
        }
        let mut names: Vec<&(String, usize)> = shapes.iter().filter(|s| s.1 > 0).collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let mut taken = std::collections::HashSet::new();
        let mut coords = Vec::with_capacity(m);
        for s in names.iter().take(m) {
            let j = rng.random_range(0..s.1);
            taken.insert((s.0.clone(), j));
            coords.push((s.0.clone(), j));
        }
        // Offsets of each tensor in one flat index space, for uniform draws.
        let mut offsets = Vec::with_capacity(names.len());
        let mut acc = 0usize;
        for s in &names {
            offsets.push(acc);
            acc += s.1;
        }
        while coords.len() < m {
            let g = rng.random_range(0..acc);
            let k = offsets.partition_point(|&o| o <= g) - 1;
            let c = (names[k].0.clone(), g - offsets[k]);
            if taken.insert(c.clone()) {
                coords.push(c);
            }
        }
        let included = (0..m).map(|_| rng.random::<bool>()).collect();
        Ok(GradientCanaries {
            ids: (0..m).map(|i| format!("canary-{i}")).collect(),
            coords,
            included,
        })
    }

    /// Number of canaries.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The CSV text: `id,included,tensor,index`.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("id,included,tensor,index\n");
        for ((id, (t, j)), inc) in self.ids.iter().zip(&self.coords).zip(&self.included) {
            s.push_str(&format!("{id},{},{t},{j}\n", u8::from(*inc)));
        }
        s
    }

    /// Reads a gradient-canaries file; errors name the file and line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        let mut lines = text.lines();
        if lines.next().map(str::trim) != Some("id,included,tensor,index") {
            return Err(Error::input("expected the header `id,included,tensor,index`")
                .with_file(path)
                .with_line(1));
        }
        let mut c = GradientCanaries {
            ids: Vec::new(),
            coords: Vec::new(),
            included: Vec::new(),
        };
        let mut seen = std::collections::HashSet::new();
        for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad = |m: String| Error::input(m).with_file(path).with_line(i + 2);
            let v: Vec<&str> = line.split(',').map(str::trim).collect();
            if v.len() != 4 {
                return Err(bad(format!("expected 4 values, got {}", v.len())));
            }
            let inc = included_bit(v[1]).map_err(bad)?;
            let j: usize = v[3]
                .parse()
                .map_err(|_| bad(format!("`index` {} is not a count", crate::error::token(v[3]))))?;
            if !seen.insert((v[2].to_string(), j)) {
                return Err(bad(format!("coordinate {}[{j}] appears twice", v[2])));
            }
            c.ids.push(v[0].to_string());
            c.included.push(inc);
            c.coords.push((v[2].to_string(), j));
        }
        if c.len() < 2 {
            return Err(Error::input("a canaries file needs at least 2 canaries").with_file(path));
        }
        Ok(c)
    }
}

/// The per-step defect a test trains with (never a user flag): each is a DP-SGD bug published
/// implementations have shipped (Tramèr et al. 2022; Nasr et al. 2023), and the white-box audit
/// must catch every one in one run.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// Noise σ/2 while the ledger says σ.
    NoiseHalved,
    /// Per-sample gradients summed unclipped.
    ClippingSkipped,
    /// Poisson sampling at 2q while the ledger says q.
    SampleRateDoubled,
    /// The noise divided by the expected batch size twice.
    NoiseOverBatchTwice,
    /// Noise only on the first half of the parameter tensors (by name).
    NoiseOnSomeTensors,
}

/// Records what a white-box auditor sees: every noisy update projected on every canary's
/// coordinate, in units of C, x_{t,i} = B·U_t[j_i]/C (U_t the released update, B the expected
/// batch the trainer divides by). A correct trainer gives x = (data's share)/C + s_{t,i} + N(0, σ²)
/// with s_{t,i} = 1 when canary i was included and sampled at step t.
pub struct WhiteBoxRecorder {
    /// The canaries.
    pub canaries: GradientCanaries,
    /// Per tensor: (canary, flat index).
    by_tensor: std::collections::BTreeMap<String, Vec<(usize, usize)>>,
    /// Observations, row-major [steps, m].
    pub observations: Vec<f32>,
    /// Steps observed.
    pub steps: usize,
}

impl WhiteBoxRecorder {
    /// A recorder for `canaries`.
    pub fn new(canaries: GradientCanaries) -> Self {
        let mut by_tensor: std::collections::BTreeMap<String, Vec<(usize, usize)>> = Default::default();
        for (i, (t, j)) in canaries.coords.iter().enumerate() {
            by_tensor.entry(t.clone()).or_default().push((i, *j));
        }
        WhiteBoxRecorder {
            canaries,
            by_tensor,
            observations: Vec::new(),
            steps: 0,
        }
    }

    /// Adds this step's canary gradients to the per-tensor sum of clipped gradients: each
    /// included canary is Poisson-sampled with probability `q` (from `rng`, the trainer's
    /// sampling stream) and contributes its gradient ([`GRADIENT_CANARY_NORM`]·C) scaled by
    /// `clip_scale` (the trainer's own clipping factor for that norm; 1 when clipping is
    /// skipped). Returns how many were sampled.
    pub fn inject<R: rand::Rng + ?Sized>(
        &self,
        sum: &mut std::collections::HashMap<String, candle_core::Tensor>,
        q: f64,
        clip: f64,
        clip_scale: f64,
        rng: &mut R,
    ) -> Result<usize> {
        let g = (GRADIENT_CANARY_NORM * clip * clip_scale) as f32;
        let mut sampled = 0;
        for (name, list) in &self.by_tensor {
            let mut hits = Vec::new();
            for &(i, j) in list {
                if self.canaries.included[i] && rng.random::<f64>() < q {
                    hits.push(j);
                }
            }
            if hits.is_empty() {
                continue;
            }
            sampled += hits.len();
            let t = sum
                .get_mut(name)
                .ok_or_else(|| Error::model(format!("gradient canary on unknown tensor `{name}`")))?;
            let mut delta = vec![0f32; t.elem_count()];
            for j in hits {
                delta[j] += g;
            }
            let d = candle_core::Tensor::from_vec(delta, t.dims(), t.device())?;
            *t = (&*t + d)?;
        }
        Ok(sampled)
    }

    /// Records the released update's value at every canary's coordinate, times `scale`
    /// (B/C: the expected batch over the clip bound).
    pub fn observe(
        &mut self,
        released: &std::collections::HashMap<String, candle_core::Tensor>,
        scale: f64,
    ) -> Result<()> {
        let m = self.canaries.len();
        let start = self.observations.len();
        self.observations.resize(start + m, 0.0);
        for (name, list) in &self.by_tensor {
            let t = released
                .get(name)
                .ok_or_else(|| Error::model(format!("no update for the canary tensor `{name}`")))?;
            let v = t.flatten_all()?.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
            for &(i, j) in list {
                self.observations[start + i] = (v[j] as f64 * scale) as f32;
            }
        }
        self.steps += 1;
        Ok(())
    }

    /// The observations as `.npy` bytes, shape [steps, m].
    pub fn observations_npy(&self) -> Vec<u8> {
        crate::data::npy::encode_f32(&[self.steps, self.canaries.len()], &self.observations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn canaries_round_trip_and_include_about_half() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let c = Canaries::generate(400, 3, &mut rng);
        let inc = c.included.iter().filter(|&&b| b).count();
        // Binomial(400, ½): mean 200, sd 10.
        assert!((160..=240).contains(&inc), "{inc}");
        assert_eq!(c.included_rows().len(), inc * 3);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.csv");
        std::fs::write(&p, c.to_csv()).unwrap();
        assert_eq!(Canaries::load(&p).unwrap(), c);
    }
}
