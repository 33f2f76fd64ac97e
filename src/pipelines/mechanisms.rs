//! Executable mechanisms on real embeddings, each keeping a ledger of what ran:
//! - DPAgg-TI (dpagg-ti.md eq. 7): normalise → sample m of n without replacement → centroid →
//!   + N(0, σ² I), σ from eq. (6) (`classic`) or the exact analytic-Gaussian calibration (`exact`);
//! - DP-RDM (dp-rdm.md Figure 4): per query, Poisson-subsample the private set at rate q, k-NN by
//!   inner product, mean (always divided by k) + N(0, σ² I), interpolate with the public k-NN at λ.
//!
//! Every release is charged to a [`Budget`] *before* it is computed: the accountant composes the
//! ledger so far plus the new event, and a release that would exceed the budget is refused.
//! The ledger is an [`EventFile`] (readable by `dpaudit account/check`), with run metadata beside
//! it in `run.json`.

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::accountants::{gdp, AccountantKind};
use crate::config::claims::{Count, Delta, Epsilon, Positive, Probability, UnitInterval};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventBuilder, EventFile, Neighbouring};
use crate::pipelines::dpagg_ti;
use crate::pipelines::embeddings::{dot, Embeddings};

/// The seeded generator of audits and tests (reproducible, public).
pub fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// What a release's randomness says of itself: drawn from the OS, or seeded (and then not
/// private against anyone who knows the seed).
pub fn randomness(seed: Option<u64>) -> &'static str {
    match seed {
        Some(_) => crate::models::folder::RANDOMNESS_SEEDED,
        None => crate::models::folder::RANDOMNESS_OS,
    }
}

/// The generator of a mechanism's released randomness (sampling and noise): a ChaCha20 stream
/// keyed by the operating system's CSPRNG (`getrandom`) unless a seed is given. A seeded stream
/// is reproducible and therefore not private against anyone who knows the seed.
pub fn noise_rng(seed: Option<u64>) -> ChaCha20Rng {
    match seed {
        Some(s) => ChaCha20Rng::seed_from_u64(s),
        None => ChaCha20Rng::from_os_rng(),
    }
}

/// Adds N(0, σ²) to every coordinate.
pub fn add_gaussian(v: &mut [f64], sigma: f64, rng: &mut impl Rng) {
    let normal = Normal::new(0.0, sigma).expect("σ validated > 0");
    v.iter_mut().for_each(|x| *x += normal.sample(rng));
}

/// A privacy budget charged release by release.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Accountant that charges each release.
    pub accountant: AccountantKind,
    /// Neighbouring relation.
    pub neighbouring: Neighbouring,
    /// δ of the budget.
    pub delta: f64,
    /// The ε budget; None: unlimited.
    pub max_epsilon: Option<f64>,
    /// Every release so far.
    pub ledger: EventBuilder,
    /// ε spent so far.
    pub spent: f64,
    /// Releases refused because they would exceed the budget.
    pub refused: u64,
}

impl Budget {
    /// An empty budget.
    pub fn new(accountant: AccountantKind, neighbouring: Neighbouring, delta: f64, max_epsilon: Option<f64>) -> Self {
        Budget {
            accountant,
            neighbouring,
            delta,
            max_epsilon,
            ledger: EventBuilder::new(),
            spent: 0.0,
            refused: 0,
        }
    }

    /// ε of the ledger plus `event` (a sound accountant only).
    pub fn epsilon_with(&self, event: &DpEvent) -> Result<f64> {
        let mut b = self.ledger.clone();
        b.push(event.clone());
        let ev = b.build();
        let acc = self.accountant.build();
        acc.supports(&ev, self.neighbouring)?;
        let r = acc.epsilon(&ev, self.neighbouring, self.delta)?;
        if !r.kind.is_sound() {
            return Err(Error::unsupported(format!(
                "{} gives an estimate, not a bound: budgets need a sound accountant",
                self.accountant.as_str()
            )));
        }
        Ok(r.epsilon)
    }

    /// Charges `event` if the budget allows it; returns false (and counts a refusal) otherwise.
    pub fn try_spend(&mut self, event: &DpEvent) -> Result<bool> {
        let eps = self.epsilon_with(event)?;
        if self.max_epsilon.is_some_and(|m| eps > m) {
            self.refused += 1;
            return Ok(false);
        }
        self.ledger.push(event.clone());
        self.spent = eps;
        Ok(true)
    }

    /// The ledger as an event file.
    pub fn event_file(&self) -> EventFile {
        EventFile {
            schema_version: 1,
            neighbouring: self.neighbouring,
            delta: Some(self.delta),
            event: self.ledger.build(),
        }
    }
}

/// Writes `ledger.toml` (an [`EventFile`] with a comment header) into `dir`.
pub fn write_ledger(dir: &Path, file: &EventFile, header: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    let body = toml::to_string(file).map_err(|e| Error::input(format!("serialising the ledger: {e}")))?;
    let mut s = String::new();
    for l in header.lines() {
        s.push_str("# ");
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(&body);
    let p = dir.join("ledger.toml");
    write_atomic(&p, s.as_bytes())?;
    Ok(p)
}

/// Writes through a temporary file in the same directory, then renames.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .permissions(crate::report::output::file_permissions())
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, &e))?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(|e| Error::io(path, &e))?;
    tmp.persist(path).map_err(|e| Error::io(path, &e.error))?;
    Ok(())
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

// ---------------------------------------------------------------------------------------------
// DPAgg-TI

/// How σ is chosen for DPAgg-TI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SigmaRule {
    /// The paper's eq. (6): σ = (2/m)·√(2 ln(1.25/δ))/ε.
    #[default]
    Classic,
    /// The smallest σ whose exact (analytic Gaussian) ε at δ is ≤ ε, without amplification.
    Exact,
}

/// A deliberate implementation bug, for showing that the audits catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    #[default]
    /// The correct mechanism.
    None,
    /// Averages the raw embeddings: the sensitivity is 2·max‖u‖/m, not 2/m.
    SkipNormalisation,
    /// Noise for a centroid over n while only m are averaged (σ too small by n/m).
    NoiseForFullN,
}

/// `dpaudit run dpagg-ti <config>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpaggTiConfig {
    /// Format version; must be 1.
    pub schema_version: u32,
    /// CSV of embeddings (relative to the config file's folder).
    pub embeddings: PathBuf,
    /// Number of records m subsampled per release.
    pub m: Count,
    /// Target ε of one release.
    pub epsilon: Epsilon,
    /// Default 1/n, as in the paper.
    #[serde(default)]
    pub delta: Option<Delta>,
    #[serde(default)]
    /// How σ is derived from ε and δ.
    pub sigma_rule: SigmaRule,
    /// Explicit σ (overrides `sigma_rule`).
    #[serde(default)]
    pub sigma: Option<Positive>,
    /// Independent noisy centroids to release (each a fresh subsample).
    #[serde(default = "one")]
    pub releases: Count,
    /// Total ε allowed over all releases (accounted exactly with GDP, no amplification credit).
    #[serde(default)]
    pub budget_epsilon: Option<Epsilon>,
    #[serde(default)]
    /// Seed of sampling and noise. Absent (the default): the noise comes from the operating
    /// system's CSPRNG. Present: reproducible, and not private against anyone who knows it.
    pub seed: Option<u64>,
}

fn one() -> Count {
    Count(1)
}

/// Loads a run config with file/line/field errors.
pub fn load_config<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let src = crate::input::read_to_string(path)?;
    let v: T = toml::from_str(&src).map_err(|e| {
        let msg = e.message().to_string();
        let mut err = crate::error::from_toml(path, &src, e);
        let field = msg
            .strip_prefix("missing field `")
            .or_else(|| msg.strip_prefix("unknown field `"))
            .and_then(|r| r.split('`').next().map(str::to_string))
            .or_else(|| {
                err.line
                    .and_then(|l| src.lines().nth(l - 1))
                    .and_then(|t| t.split_once('=').map(|(k, _)| k.trim().to_string()))
            });
        if let Some(f) = field {
            err = err.with_field(f);
        }
        err
    })?;
    Ok(v)
}

/// The resolved DPAgg-TI mechanism.
#[derive(Debug, Clone)]
pub struct DpaggTi {
    /// Rows as the mechanism averages them (normalised unless the fault skips it).
    pub data: Embeddings,
    /// Records subsampled per release.
    pub m: usize,
    /// Noise std actually added.
    pub sigma: f64,
    /// Noise multiplier the implementation claims, relative to the sensitivity 2/m (what its
    /// ledger records). Equals σ/(2/m) unless a [`Fault`] is injected.
    pub noise_multiplier: f64,
    /// δ of one release.
    pub delta: f64,
    /// Deliberate bug to inject (`None` normally).
    pub fault: Fault,
}

impl DpaggTi {
    /// Builds the mechanism from raw embeddings; σ from the rule (or explicit).
    pub fn new(
        raw: &Embeddings,
        m: usize,
        epsilon: f64,
        delta: Option<f64>,
        rule: SigmaRule,
        sigma: Option<f64>,
        fault: Fault,
    ) -> Result<Self> {
        let n = raw.len();
        if m == 0 || m > n {
            return Err(Error::field("m", format!("must be in 1..={n}, got {m}")));
        }
        let delta = delta.unwrap_or(1.0 / n as f64);
        let data = if fault == Fault::SkipNormalisation {
            raw.clone()
        } else {
            raw.normalised()?
        };
        // The claimed sensitivity of the centroid is 2/m; z is the noise multiplier the code
        // believes it uses (and records in its ledger).
        let claimed_sens = dpagg_ti::UNIT_SUM_SENSITIVITY / m as f64;
        let z = match (sigma, rule) {
            (Some(s), _) => s / claimed_sens,
            (None, SigmaRule::Classic) => dpagg_ti::classic_noise_multiplier(epsilon, delta),
            (None, SigmaRule::Exact) => exact_noise_multiplier(epsilon, delta)?,
        };
        // The faulty variant scales the noise for a centroid over n (eq. 6 as printed) although
        // only m are averaged.
        let actual_sens = if fault == Fault::NoiseForFullN {
            dpagg_ti::UNIT_SUM_SENSITIVITY / n as f64
        } else {
            claimed_sens
        };
        // A tiny ε makes the classic σ overflow (or a tiny σ underflow): the mechanism
        // needs a finite positive noise scale (found by the fuzz harness).
        let sigma_actual = z * actual_sens;
        if !(z.is_finite() && z > 0.0 && sigma_actual.is_finite() && sigma_actual > 0.0) {
            return Err(Error::field(
                if sigma.is_some() { "sigma" } else { "epsilon" },
                format!(
                    "gives a noise std σ = {sigma_actual} (noise multiplier {z}), not a finite number > 0 \
                     (ε = {epsilon}, δ = {delta})"
                ),
            ));
        }
        Ok(DpaggTi {
            data,
            m,
            sigma: sigma_actual,
            noise_multiplier: z,
            delta,
            fault,
        })
    }

    /// One release's event under the claimed sensitivity (what an honest ledger records).
    pub fn event(&self) -> DpEvent {
        DpEvent::SampledWithoutReplacement {
            n: self.data.len() as u64,
            m: self.m as u64,
            event: Box::new(DpEvent::gaussian(self.noise_multiplier)),
        }
    }

    /// Centroid of the rows at `idx` (the deterministic part).
    pub fn centroid(&self, rows: &[Vec<f64>], idx: &[usize]) -> Vec<f64> {
        let mut c = vec![0.0; rows[0].len()];
        for &i in idx {
            c.iter_mut().zip(&rows[i]).for_each(|(a, b)| *a += b);
        }
        c.iter_mut().for_each(|a| *a /= self.m as f64);
        c
    }

    /// Samples m indices without replacement.
    pub fn subsample(&self, rng: &mut impl Rng) -> Vec<usize> {
        sample(rng, self.data.len(), self.m).into_vec()
    }

    /// One release on `rows` (the mechanism's own data or a neighbour): (indices, noisy centroid).
    pub fn release_on(&self, rows: &[Vec<f64>], rng: &mut impl Rng) -> (Vec<usize>, Vec<f64>) {
        let idx = sample(rng, rows.len(), self.m).into_vec();
        let mut c = self.centroid(rows, &idx);
        add_gaussian(&mut c, self.sigma, rng);
        (idx, c)
    }
}

/// The smallest noise multiplier whose exact Gaussian ε at δ is ≤ ε (analytic Gaussian
/// calibration, Balle & Wang 2018 Alg. 1, via exact GDP): rounded up.
pub fn exact_noise_multiplier(epsilon: f64, delta: f64) -> Result<f64> {
    // ε(μ) increases in μ: find the largest μ with ε(μ) ≤ target, return 1/μ rounded up.
    let f = |mu: f64| gdp::epsilon_for_delta(mu, delta).unwrap_or(f64::INFINITY) - epsilon;
    let mut hi = 1.0;
    while f(hi) < 0.0 {
        hi *= 2.0;
        if hi > 1e8 {
            return Err(Error::numeric("exact calibration: no bracket"));
        }
    }
    let (lo, _) = crate::numeric::roots::brent(f, 1e-12, hi, 1e-12, 1e-15)?;
    Ok(1.0 / lo * (1.0 + 1e-12))
}

/// What a DPAgg-TI run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpaggTiRun {
    /// Number of private records.
    pub n: usize,
    /// Records subsampled per release.
    pub m: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Noise std σ.
    pub sigma: f64,
    /// Noise multiplier σ / sensitivity.
    pub noise_multiplier: f64,
    /// δ per release.
    pub delta: f64,
    /// Seed used (None: OS randomness).
    pub seed: Option<u64>,
    /// Where the noise came from ([`randomness`]).
    pub randomness: String,
    /// Releases made.
    pub released: u64,
    /// Releases refused by the budget.
    pub refused: u64,
    /// ε spent.
    pub epsilon_spent: f64,
    /// Accountant that charged the budget.
    pub accountant: AccountantKind,
    /// The released centroids.
    pub outputs: Vec<Vec<f64>>,
}

/// Runs DPAgg-TI `releases` times under an optional budget (GDP exact, replace-one, no
/// amplification credit: a sound, conservative charge).
pub fn run_dpagg_ti(mech: &DpaggTi, releases: u64, budget: Option<f64>, seed: u64) -> Result<(DpaggTiRun, Budget)> {
    run_dpagg_ti_noise(mech, releases, budget, Some(seed))
}

/// [`run_dpagg_ti`] with the noise from the OS CSPRNG when `seed` is None ([`noise_rng`]).
pub fn run_dpagg_ti_noise(
    mech: &DpaggTi,
    releases: u64,
    budget: Option<f64>,
    seed: Option<u64>,
) -> Result<(DpaggTiRun, Budget)> {
    let mut r = noise_rng(seed);
    let mut b = Budget::new(AccountantKind::Gdp, Neighbouring::ReplaceOne, mech.delta, budget);
    // GDP cannot account the sampled event; charge the Gaussian (no amplification credit) and
    // record the sampled event in the ledger.
    let charge = DpEvent::gaussian(mech.noise_multiplier);
    // Termination and memory, proven before the loop: ε is non-decreasing in the number of
    // releases, so the budget allows exactly the first `allowed` of them (found by bisection,
    // ≤ 64 accountant calls); only those can run, and they must fit the resource limits.
    let allowed = match budget {
        Some(max) => affordable_releases(&b, &charge, releases, max)?,
        None => releases,
    };
    let (dim, m) = (mech.data.dim() as f64, mech.m as f64);
    crate::limits::check(
        "releases",
        allowed as f64,
        crate::limits::Cost::new(
            crate::limits::RELEASED_COORDINATE.bytes * dim,
            crate::limits::RELEASED_COORDINATE.work * (dim + m),
        ),
    )?;
    let mut ledger = EventBuilder::new();
    let mut outputs = Vec::new();
    for _ in 0..allowed {
        if !b.try_spend(&charge)? {
            // Cannot happen when `allowed` is right; stop rather than loop on.
            break;
        }
        ledger.push(mech.event());
        let (_, out) = mech.release_on(&mech.data.rows, &mut r);
        outputs.push(out);
    }
    // Every release past the budget is refused (the events are identical, so once one is
    // refused all later ones are).
    b.refused = releases - outputs.len() as u64;
    let run = DpaggTiRun {
        n: mech.data.len(),
        m: mech.m,
        dim: mech.data.dim(),
        sigma: mech.sigma,
        noise_multiplier: mech.noise_multiplier,
        delta: mech.delta,
        seed,
        randomness: randomness(seed).into(),
        released: outputs.len() as u64,
        refused: b.refused,
        epsilon_spent: b.spent,
        accountant: b.accountant,
        outputs,
    };
    b.ledger = ledger;
    Ok((run, b))
}

/// The largest k ≤ `releases` such that k releases of `charge` fit the budget `max`
/// (ε non-decreasing in k; bisection, at most 64 accountant calls).
fn affordable_releases(b: &Budget, charge: &DpEvent, releases: u64, max: f64) -> Result<u64> {
    let fits = |k: u64| -> Result<bool> {
        if k == 0 {
            return Ok(true);
        }
        let mut probe = b.clone();
        probe.ledger = EventBuilder::new();
        probe.ledger.push_n(charge.clone(), k - 1);
        Ok(probe.epsilon_with(charge)? <= max)
    };
    if fits(releases)? {
        return Ok(releases);
    }
    // Invariant: fits(lo) and !fits(hi).
    let (mut lo, mut hi) = (0u64, releases);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

impl DpaggTiConfig {
    /// Loads the config and its embeddings, and builds the mechanism.
    pub fn load(path: &Path) -> Result<(Self, DpaggTi)> {
        let c: DpaggTiConfig = load_config(path)?;
        if c.schema_version != 1 {
            return Err(Error::field(
                "schema_version",
                format!("unsupported schema_version {}", c.schema_version),
            )
            .with_file(path));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let raw = Embeddings::load_csv(&resolve(base, &c.embeddings))?;
        let mech = DpaggTi::new(
            &raw,
            c.m.get() as usize,
            c.epsilon.get(),
            c.delta.map(|d| d.get()),
            c.sigma_rule,
            c.sigma.map(|s| s.get()),
            Fault::None,
        )
        .map_err(|e| e.with_file(path))?;
        Ok((c, mech))
    }
}

// ---------------------------------------------------------------------------------------------
// DP-RDM

/// `dpaudit run dp-rdm <config>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpRdmConfig {
    /// Format version; must be 1.
    pub schema_version: u32,
    /// Private retrieval set, public retrieval set, queries: CSVs (relative to the config).
    pub private: PathBuf,
    /// Public embeddings (CSV).
    pub public: PathBuf,
    /// Query embeddings (CSV).
    pub queries: PathBuf,
    /// Neighbours retrieved per query.
    pub k: Count,
    /// Poisson sampling rate of the private set per query.
    pub q: Probability,
    /// Noise std σ.
    pub sigma: Positive,
    /// Mixing weight λ of the retrieved mean.
    pub lambda: UnitInterval,
    /// Default 1/n (n = private rows), as in the paper.
    #[serde(default)]
    pub delta: Option<Delta>,
    /// Queries past this ε are refused.
    pub budget_epsilon: Epsilon,
    /// `rdp` (default) or `pld`.
    #[serde(default = "rdp")]
    pub accountant: AccountantKind,
    /// Answer at most this many queries from the file.
    #[serde(default)]
    pub max_queries: Option<Count>,
    #[serde(default)]
    /// Seed of sampling and noise. Absent (the default): the noise comes from the operating
    /// system's CSPRNG. Present: reproducible, and not private against anyone who knows it.
    pub seed: Option<u64>,
}

fn rdp() -> AccountantKind {
    AccountantKind::Rdp
}

/// The resolved DP-RDM mechanism (unit-norm private and public sets).
#[derive(Debug, Clone)]
pub struct DpRdm {
    /// Private embeddings, unit norm.
    pub private: Embeddings,
    /// Public embeddings, unit norm.
    pub public: Embeddings,
    /// Neighbours per query.
    pub k: usize,
    /// Poisson sampling rate.
    pub q: f64,
    /// Noise std σ.
    pub sigma: f64,
    /// Mixing weight λ.
    pub lambda: f64,
}

/// One answered query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RdmAnswer {
    /// Noisy aggregate z = (1/k) Σ N_k + N(0, σ² I).
    pub z: Vec<f64>,
    /// e_j = (1 − λ)·O_k⁽ʲ⁾ + λ·z for the k public neighbours.
    pub interpolated: Vec<Vec<f64>>,
    /// Size of the Poisson subsample.
    pub sampled: usize,
}

/// Indices of the (up to) k rows with the largest inner product with `y` (ties by index).
pub fn top_k(rows: &[Vec<f64>], candidates: &[usize], y: &[f64], k: usize) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = candidates.iter().map(|&i| (dot(&rows[i], y), i)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.truncate(k);
    scored.into_iter().map(|(_, i)| i).collect()
}

impl DpRdm {
    /// Noise multiplier under Theorem 3.1's sensitivity 2/k.
    pub fn noise_multiplier(&self) -> f64 {
        self.sigma * self.k as f64 / 2.0
    }
    /// One query's event (Theorem 3.1 form, accounted with the add/remove mixture formula at
    /// sensitivity 2/k).
    pub fn event(&self) -> DpEvent {
        DpEvent::poisson(self.q, DpEvent::gaussian(self.noise_multiplier()))
    }
    /// The deterministic aggregate: (1/k)·Σ of the k nearest among `subset` (divided by k even
    /// when fewer than k were sampled, so the sensitivity stays 2/k).
    pub fn aggregate(&self, rows: &[Vec<f64>], subset: &[usize], y: &[f64]) -> Vec<f64> {
        let mut s = vec![0.0; y.len()];
        for i in top_k(rows, subset, y, self.k) {
            s.iter_mut().zip(&rows[i]).for_each(|(a, b)| *a += b);
        }
        s.iter_mut().for_each(|a| *a /= self.k as f64);
        s
    }
    /// Poisson subsample of `len` rows at rate q.
    pub fn poisson_subset(&self, len: usize, rng: &mut impl Rng) -> Vec<usize> {
        (0..len).filter(|_| rng.random::<f64>() < self.q).collect()
    }
    /// Answers one query on `rows` (the private set or a neighbour of it).
    pub fn answer_on(&self, rows: &[Vec<f64>], y: &[f64], rng: &mut impl Rng) -> RdmAnswer {
        let subset = self.poisson_subset(rows.len(), rng);
        let mut z = self.aggregate(rows, &subset, y);
        add_gaussian(&mut z, self.sigma, rng);
        let all: Vec<usize> = (0..self.public.len()).collect();
        let interpolated = top_k(&self.public.rows, &all, y, self.k)
            .into_iter()
            .map(|j| {
                self.public.rows[j]
                    .iter()
                    .zip(&z)
                    .map(|(o, zz)| (1.0 - self.lambda) * o + self.lambda * zz)
                    .collect()
            })
            .collect();
        RdmAnswer {
            z,
            interpolated,
            sampled: subset.len(),
        }
    }
}

/// What a DP-RDM run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DpRdmRun {
    /// Number of private records.
    pub n: usize,
    /// Neighbours per query.
    pub k: usize,
    /// Poisson sampling rate.
    pub q: f64,
    /// Noise std σ.
    pub sigma: f64,
    /// Mixing weight λ.
    pub lambda: f64,
    /// Noise multiplier (σ over the sensitivity).
    pub noise_multiplier: f64,
    /// δ of the budget.
    pub delta: f64,
    /// The ε budget.
    pub budget_epsilon: f64,
    /// Accountant that charged the budget.
    pub accountant: AccountantKind,
    /// Seed used (None: OS randomness).
    pub seed: Option<u64>,
    /// Where the noise came from ([`randomness`]).
    pub randomness: String,
    /// Queries answered.
    pub answered: u64,
    /// Queries refused by the budget.
    pub refused: u64,
    /// ε spent.
    pub epsilon_spent: f64,
    /// One answer per query.
    pub answers: Vec<RdmAnswer>,
}

/// Answers `queries` in order, charging each to the budget before computing it; stops at the
/// first refusal (every later query would be refused too: the events are identical).
pub fn run_dp_rdm(
    mech: &DpRdm,
    queries: &Embeddings,
    budget: f64,
    delta: f64,
    accountant: AccountantKind,
    seed: u64,
) -> Result<(DpRdmRun, Budget)> {
    run_dp_rdm_noise(mech, queries, budget, delta, accountant, Some(seed))
}

/// [`run_dp_rdm`] with the noise from the OS CSPRNG when `seed` is None ([`noise_rng`]).
pub fn run_dp_rdm_noise(
    mech: &DpRdm,
    queries: &Embeddings,
    budget: f64,
    delta: f64,
    accountant: AccountantKind,
    seed: Option<u64>,
) -> Result<(DpRdmRun, Budget)> {
    let mut r = noise_rng(seed);
    // λ = 0 releases nothing private; otherwise Theorem 3.1's event per query.
    let ev = if mech.lambda == 0.0 {
        DpEvent::NoOp
    } else {
        mech.event()
    };
    let mut b = Budget::new(accountant, Neighbouring::AddRemove, delta, Some(budget));
    let mut answers = Vec::new();
    for y in &queries.rows {
        if ev != DpEvent::NoOp && !b.try_spend(&ev)? {
            b.refused = (queries.len() - answers.len()) as u64;
            break;
        }
        answers.push(mech.answer_on(&mech.private.rows, y, &mut r));
    }
    let run = DpRdmRun {
        n: mech.private.len(),
        k: mech.k,
        q: mech.q,
        sigma: mech.sigma,
        lambda: mech.lambda,
        noise_multiplier: mech.noise_multiplier(),
        delta,
        budget_epsilon: budget,
        accountant,
        seed,
        randomness: randomness(seed).into(),
        answered: answers.len() as u64,
        refused: b.refused,
        epsilon_spent: b.spent,
        answers,
    };
    Ok((run, b))
}

impl DpRdmConfig {
    /// Loads the config and its three embedding files (all normalised).
    pub fn load(path: &Path) -> Result<(Self, DpRdm, Embeddings)> {
        let c: DpRdmConfig = load_config(path)?;
        if c.schema_version != 1 {
            return Err(Error::field(
                "schema_version",
                format!("unsupported schema_version {}", c.schema_version),
            )
            .with_file(path));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let private = Embeddings::load_csv(&resolve(base, &c.private))?.normalised()?;
        let public = Embeddings::load_csv(&resolve(base, &c.public))?.normalised()?;
        let mut queries = Embeddings::load_csv(&resolve(base, &c.queries))?.normalised()?;
        if public.dim() != private.dim() || queries.dim() != private.dim() {
            return Err(Error::input(format!(
                "dimensions differ: private {}, public {}, queries {}",
                private.dim(),
                public.dim(),
                queries.dim()
            ))
            .with_file(path));
        }
        if let Some(mq) = c.max_queries {
            queries.rows.truncate(mq.get() as usize);
        }
        let mech = DpRdm {
            private,
            public,
            k: c.k.get() as usize,
            q: c.q.get(),
            sigma: c.sigma.get(),
            lambda: c.lambda.get(),
        };
        Ok((c, mech, queries))
    }
}
