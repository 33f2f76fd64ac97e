//! Accountants: turn a [`DpEvent`] into (ε, δ) statements.
//!
//! Every accountant answers through the [`Accountant`] trait and says what kind of number it
//! gives ([`BoundKind`]): an auditor's tool never presents an estimate as a bound.

pub mod attack_limits;
pub mod calibrate;
pub mod clt;
pub mod convert;
pub mod gdp;
pub mod pld;
pub mod pld_lower;
pub mod rdp;
pub mod sound;
pub mod tilted;
pub mod tradeoff;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};

/// What kind of number an accountant returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    /// The true value (up to floating point, rounded to the safe side).
    Exact,
    /// A sound upper bound on ε (or δ): the truth is never above it.
    UpperBound,
    /// An approximation (e.g. the GDP central limit theorem): may be below the truth.
    Estimate,
    /// A sound lower bound on ε (or δ): the truth is never below it. Witnesses violations.
    LowerBound,
    /// Computed from the private data itself (e.g. μ along real trajectories of the data's
    /// density): describes this dataset, not a DP guarantee.
    DataDependent,
}

impl BoundKind {
    /// True when a budget may be checked against this number (a sound *upper* bound: exact or
    /// upper bound).
    pub fn is_sound(self) -> bool {
        matches!(self, BoundKind::Exact | BoundKind::UpperBound)
    }
    /// True when this number is a sound *lower* bound (exact or lower bound).
    pub(crate) fn is_lower(self) -> bool {
        matches!(self, BoundKind::Exact | BoundKind::LowerBound)
    }
    /// The name used in machine-readable output (`exact`, `upper_bound`, `estimate`).
    pub fn as_str(self) -> &'static str {
        match self {
            BoundKind::Exact => "exact",
            BoundKind::UpperBound => "upper_bound",
            BoundKind::Estimate => "estimate",
            BoundKind::LowerBound => "lower_bound",
            BoundKind::DataDependent => "data_dependent",
        }
    }

    // Every wording of a kind lives here; nothing else in the crate spells one out. Shipped
    // reports and golden files are re-derived byte for byte, so each phrasing is kept as it was.

    /// The kind in words (`exact`, `upper bound`, `estimate`, …; also its `Display`): verdict
    /// messages, plot legends and table labels.
    pub fn describe(self) -> &'static str {
        match self {
            BoundKind::Exact => "exact",
            BoundKind::UpperBound => "upper bound",
            BoundKind::Estimate => "estimate",
            BoundKind::LowerBound => "lower bound",
            BoundKind::DataDependent => "data dependent",
        }
    }

    /// [`Self::describe`] with the caveat a reader needs beside a number that is not a DP
    /// guarantee (report tables: `estimate (not a guarantee)`).
    pub(crate) fn with_caveat(self) -> &'static str {
        match self {
            BoundKind::Estimate => "estimate (not a guarantee)",
            BoundKind::DataDependent => "data-dependent: not a DP guarantee",
            other => other.describe(),
        }
    }

    /// [`Self::with_caveat`] for a terminal, where a number that is not a guarantee shouts
    /// (`ESTIMATE (not a guarantee)`).
    pub(crate) fn shouted(self) -> &'static str {
        match self {
            BoundKind::Estimate => "ESTIMATE (not a guarantee)",
            other => other.with_caveat(),
        }
    }

    /// The kind as a noun phrase for sentences (`an upper bound`, `an estimate`).
    pub(crate) fn noun_phrase(self) -> &'static str {
        match self {
            BoundKind::Exact => "an exact value",
            BoundKind::UpperBound => "an upper bound",
            BoundKind::Estimate => "an estimate",
            BoundKind::LowerBound => "a lower bound",
            BoundKind::DataDependent => "a data-dependent number (not a DP guarantee)",
        }
    }
}

impl std::fmt::Display for BoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Which accountant (CLI `--accountant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum AccountantKind {
    /// Exact Gaussian differential privacy (full-batch Gaussians only).
    Gdp,
    /// Dong–Roth–Su central limit theorem: an estimate, never a bound.
    Clt,
    /// Rényi DP with conversion to (ε, δ): an upper bound.
    Rdp,
    /// Privacy-loss distributions composed by FFT: an upper bound.
    Pld,
}

impl AccountantKind {
    /// Every accountant, in output order.
    pub const ALL: [AccountantKind; 4] = [
        AccountantKind::Gdp,
        AccountantKind::Clt,
        AccountantKind::Rdp,
        AccountantKind::Pld,
    ];
    /// The CLI spelling (`gdp`, `clt`, `rdp`, `pld`).
    pub fn as_str(self) -> &'static str {
        match self {
            AccountantKind::Gdp => "gdp",
            AccountantKind::Clt => "clt",
            AccountantKind::Rdp => "rdp",
            AccountantKind::Pld => "pld",
        }
    }
    /// A boxed accountant with default settings.
    pub fn build(self) -> Box<dyn Accountant> {
        match self {
            AccountantKind::Gdp => Box::new(gdp::GdpAccountant),
            AccountantKind::Clt => Box::new(clt::CltAccountant),
            AccountantKind::Rdp => Box::new(rdp::RdpAccountant::default()),
            AccountantKind::Pld => Box::new(pld::PldAccountant::default()),
        }
    }
}

impl std::str::FromStr for AccountantKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "gdp" => Ok(AccountantKind::Gdp),
            "clt" => Ok(AccountantKind::Clt),
            "rdp" => Ok(AccountantKind::Rdp),
            "pld" => Ok(AccountantKind::Pld),
            other => Err(Error::field(
                "--accountant",
                format!("unknown accountant `{other}` (expected gdp, clt, rdp, pld or all)"),
            )),
        }
    }
}

/// A free-form diagnostic attached to a result (validity conditions, warnings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Diagnostic {
    /// Stable machine-readable code, e.g. `clt_step_dominates`.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
    /// True when the condition invalidates (or strongly undermines) the number.
    pub severe: bool,
}

/// The one record of "an ε with its kind and evidence": ε at δ, who computed it (an accountant,
/// or a named closed form or theorem), what kind of number it is (sound upper bound, sound lower
/// bound, estimate, …), what it rests on, and the numbers and diagnostics behind it. Every
/// accountant answers with one ([`Accountant::epsilon`], [`Accountant::delta`]); it carries a
/// verdict's evidence ([`sound::Decision::evidence`]), every analysis of a
/// [`sound::SoundEpsilon`], the accounted guarantees an attack is compared with
/// ([`attack_limits::guarantees_for`], with the μ of a μ-GDP guarantee in `details`), and a
/// report's results.
///
/// JSON: `method` is always written (the accountant's name or the closed form's), `accountant`
/// only when one computed the number; ε and δ write ∞ as `"inf"` ([`crate::numeric::json`]);
/// `note`, `details`, `diagnostics` and `mechanism` only when they say something.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "EvidenceRow", into = "EvidenceRow")]
pub struct Evidence {
    /// Short method name: the accountant's (`pld`, `rdp`, `gdp`, `clt`) or a closed form's or
    /// theorem's (`delta_floor`, `worst_case_pair`, `rapid_theorem_1`, …).
    pub method: String,
    /// The accountant that computed the number; `None` for a closed form or theorem.
    pub accountant: Option<AccountantKind>,
    /// ε (nats); ∞ when nothing finite is certified. For a δ(ε) query, the given ε.
    pub epsilon: f64,
    /// δ at which ε holds; for a δ(ε) query, the answer.
    pub delta: f64,
    /// What kind of number this is; only `Exact` and `UpperBound` bound ε from above,
    /// only `Exact` and `LowerBound` from below.
    pub kind: BoundKind,
    /// What the number rests on (preconditions, witness event, fallbacks); may be empty.
    pub note: String,
    /// Extra numbers worth showing (e.g. `mu`, `rdp_order`, `truncation_mass`).
    pub details: BTreeMap<String, f64>,
    /// Validity conditions and warnings attached to this number.
    pub diagnostics: Vec<Diagnostic>,
    /// The mechanism the number is about, when a report holds several (e.g. `checkpoint`).
    pub mechanism: Option<String>,
}

/// The JSON shape of an [`Evidence`] (see there).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvidenceRow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    accountant: Option<AccountantKind>,
    #[serde(with = "crate::numeric::json")]
    epsilon: f64,
    #[serde(with = "crate::numeric::json")]
    delta: f64,
    kind: BoundKind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
    /// Read only: records written before μ moved into `details`.
    #[serde(default, skip_serializing)]
    mu: Option<f64>,
    #[serde(
        default,
        with = "crate::numeric::json::map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    details: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    diagnostics: Vec<Diagnostic>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mechanism: Option<String>,
}

impl From<Evidence> for EvidenceRow {
    fn from(e: Evidence) -> Self {
        EvidenceRow {
            method: Some(e.method),
            accountant: e.accountant,
            epsilon: e.epsilon,
            delta: e.delta,
            kind: e.kind,
            note: e.note,
            mu: None,
            details: e.details,
            diagnostics: e.diagnostics,
            mechanism: e.mechanism,
        }
    }
}

impl TryFrom<EvidenceRow> for Evidence {
    type Error = String;
    /// A record read back; `method` defaults to the accountant's name. A record naming neither
    /// says nothing about who computed its ε, and is refused.
    fn try_from(r: EvidenceRow) -> std::result::Result<Self, String> {
        let method = r
            .method
            .or_else(|| r.accountant.map(|a| a.as_str().to_string()))
            .ok_or("an ε record must name its `method` or its `accountant`")?;
        let mut details = r.details;
        if let Some(mu) = r.mu {
            details.entry("mu".to_string()).or_insert(mu);
        }
        Ok(Evidence {
            method,
            accountant: r.accountant,
            epsilon: r.epsilon,
            delta: r.delta,
            kind: r.kind,
            note: r.note,
            details,
            diagnostics: r.diagnostics,
            mechanism: r.mechanism,
        })
    }
}

impl Evidence {
    /// A number from a closed form or theorem (no accountant).
    pub fn new(method: &str, epsilon: f64, delta: f64, kind: BoundKind) -> Self {
        Evidence {
            method: method.to_string(),
            accountant: None,
            epsilon,
            delta,
            kind,
            note: String::new(),
            details: BTreeMap::new(),
            diagnostics: Vec::new(),
            mechanism: None,
        }
    }
    /// An accountant's answer, without details or diagnostics.
    pub fn of(accountant: AccountantKind, epsilon: f64, delta: f64, kind: BoundKind) -> Self {
        Evidence::new(accountant.as_str(), epsilon, delta, kind).with_accountant(accountant)
    }
    /// Sets the accountant that computed the number (the method keeps its name, e.g.
    /// `gdp_exact_lower` computed by `gdp`).
    pub(crate) fn with_accountant(mut self, kind: AccountantKind) -> Self {
        self.accountant = Some(kind);
        self
    }
    /// Names the mechanism the number is about.
    #[cfg_attr(not(feature = "models"), allow(dead_code))] // used by the attacks (feature `models`)
    pub(crate) fn for_mechanism(mut self, mechanism: &str) -> Self {
        self.mechanism = Some(mechanism.to_string());
        self
    }
    /// Adds a named number to `details`.
    pub(crate) fn with_detail(mut self, key: &str, value: f64) -> Self {
        self.details.insert(key.to_string(), value);
        self
    }
    /// Adds a diagnostic with its code, message and severity.
    pub(crate) fn with_diagnostic(mut self, code: &str, message: impl Into<String>, severe: bool) -> Self {
        self.diagnostics.push(Diagnostic {
            code: code.into(),
            message: message.into(),
            severe,
        });
        self
    }
    /// Sets the note.
    pub(crate) fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
    /// μ when the number is the ε of a μ-GDP guarantee (`details.mu`; tighter attack limits:
    /// Φ(μ/2)).
    pub fn mu(&self) -> Option<f64> {
        self.details.get("mu").copied()
    }
    /// Sets μ (`details.mu`); `None` removes it.
    pub(crate) fn set_mu(&mut self, mu: Option<f64>) {
        match mu {
            Some(m) => self.details.insert("mu".to_string(), m),
            None => self.details.remove("mu"),
        };
    }
    /// The same record with its note stating what an accountant's number rests on, when the
    /// note is empty: the RDP fallback of a PLD, or the optimal RDP order. Used where the
    /// number becomes a verdict's evidence.
    pub(crate) fn cited(&self) -> Self {
        let mut e = self.clone();
        if e.note.is_empty() {
            if let Some(d) = e.diagnostics.iter().find(|d| d.code == "pld_fallback_rdp") {
                e.note = d.message.clone();
            } else if let Some(order) = e.details.get("rdp_order").or_else(|| e.details.get("order")) {
                e.note = format!("optimal order α = {order:.4}");
            }
        }
        e
    }
    /// True when this is a sound upper bound on ε (exact or upper bound, not NaN).
    pub(crate) fn is_upper(&self) -> bool {
        self.kind.is_sound() && !self.epsilon.is_nan()
    }
    /// True when this is a sound lower bound on ε (exact or lower bound, not NaN).
    pub(crate) fn is_lower(&self) -> bool {
        self.kind.is_lower() && !self.epsilon.is_nan()
    }
    /// "ε = 1.23 (pld, upper_bound)" for messages.
    pub fn describe(&self) -> String {
        format!(
            "ε = {} ({}, {})",
            sound::show(self.epsilon),
            self.source(),
            self.kind.as_str()
        )
    }
    /// The accountant's name, or the method when no accountant computed it.
    pub fn source(&self) -> &str {
        self.accountant.map_or(self.method.as_str(), |a| a.as_str())
    }
    /// True when `kind` computed this number.
    pub fn is_from(&self, kind: AccountantKind) -> bool {
        self.accountant == Some(kind)
    }
    /// ` — event.events[1] is non-private (no guarantee)` when this result is ε = ∞ because the
    /// event holds a [`crate::events::DpEvent::NonPrivate`]; empty otherwise.
    pub(crate) fn non_private_note(&self) -> String {
        self.diagnostics
            .iter()
            .find(|d| d.code == "non_private")
            .and_then(|d| d.message.split_once(" is non-private"))
            .map(|(path, _)| format!(" — {path} is non-private (no guarantee)"))
            .unwrap_or_default()
    }
}

/// The interface every accountant implements. `supports` and the accounting itself must
/// agree: implementations derive both from the same walk over the event (usually
/// [`DpEvent::components`]).
pub trait Accountant: Send + Sync {
    /// Which accountant this is.
    fn kind(&self) -> AccountantKind;
    /// Ok if this accountant can account `event` under `neighbouring`; otherwise an
    /// `Unsupported` error naming the offending sub-event (its path in the tree).
    fn supports(&self, event: &DpEvent, neighbouring: Neighbouring) -> Result<()>;
    /// ε at the given δ.
    fn epsilon(&self, event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Result<Evidence>;
    /// δ at the given ε (the result's `delta` field holds it).
    fn delta(&self, event: &DpEvent, neighbouring: Neighbouring, epsilon: f64) -> Result<Evidence>;
    /// ε at `delta`, exactly as [`Accountant::epsilon`] gives it, and ε at each δ of `grid`
    /// (the points of an ε-versus-δ plot) read from the work done for `delta`: an accountant
    /// whose work is a composition independent of δ (PLD: the composed distributions; RDP: the
    /// composed RDP at each order) builds it once and converts every δ from it. A grid value is
    /// a sound bound of the same kind as `epsilon` at that δ and equals it wherever that δ needs
    /// no more than `delta` did (PLD: no precise composition of its own; RDP: the grid orders,
    /// without the refinement between them), and is never below it otherwise.
    /// The default asks `epsilon` once per δ (closed forms: exact for every δ).
    fn epsilon_profile(
        &self,
        event: &DpEvent,
        neighbouring: Neighbouring,
        delta: f64,
        grid: &[f64],
    ) -> (Result<Evidence>, Vec<Result<Evidence>>) {
        (
            self.epsilon(event, neighbouring, delta),
            grid.iter().map(|&d| self.epsilon(event, neighbouring, d)).collect(),
        )
    }
}

/// Validates a δ given by a user.
pub fn check_delta(delta: f64) -> Result<()> {
    if !(delta > 0.0 && delta < 1.0) {
        return Err(Error::field("delta", format!("δ must be in (0, 1), got {delta}")));
    }
    Ok(())
}

/// Validates an ε given by a user.
pub(crate) fn check_epsilon(epsilon: f64) -> Result<()> {
    if !(epsilon >= 0.0 && epsilon.is_finite()) {
        return Err(Error::field(
            "epsilon",
            format!("ε must be finite and ≥ 0, got {epsilon}"),
        ));
    }
    Ok(())
}

/// The smallest Gaussian noise multiplier σ whose accounting any accountant here certifies.
/// Below it every accountant answers ε = ∞ (and δ = 1), labelled as a bound, with the severe
/// diagnostic `noise_below_certified_range`; a pipeline that needs a finite ε then fails its
/// budget or claim instead of being certified by a number its arithmetic cannot back.
///
/// Reporting ε = ∞ (δ = 1) is always sound. Where the certified range of each accountant ends
/// (u = 2⁻⁵³; σ ≥ 10⁻¹⁰⁰ gives σ² ≥ 10⁻²⁰⁰, a normal double, and μ = 1/σ ≤ 10¹⁰⁰):
/// - **gdp**: μ² = Σ count/σ² (DRS Cor. 3.3). While σ² is a normal double it carries relative
///   error ≤ u, so μ is accurate to a few u and overflow goes to μ = ∞ (ε = ∞, sound). Below
///   σ ≈ 1.5·10⁻¹⁵⁴ σ² is subnormal (relative error up to 100 %) or 0: μ could be rounded down.
/// - **rdp**: the Poisson series (MTZ 2019 §3.2) has exponents c·k(k − 1), c = 1/(2σ²), for
///   orders k ≤ 2²⁰. They are finite while c·2⁴⁰ < 2¹⁰²⁴, i.e. σ > 2⁻⁴⁹² ≈ 10⁻¹⁴⁸; below it c or
///   the exponents overflow to ∞ and ln(e^∞ − e^∞) is NaN, which `f64::max(NaN, 0) = 0` would
///   have turned into an ε = 0 certificate (σ = 10⁻¹⁶⁰ did exactly that). At σ = 10⁻¹⁰⁰ every
///   exponent is ≤ 5·10¹⁹⁹·2⁴⁰ < 10²¹², far from overflow.
/// - **pld**: the Gaussian leaf's losses μx − μ²/2 need μ² finite (σ > 2⁻⁵¹²); losses above the
///   grid's top are infinite mass, so every nearly blatant step only raises the δ floor.
/// - **clt**: an estimate with μᵢ = 1/σᵢ (never a bound); ∞ is reported for the same inputs so
///   that no command prints a finite estimate beside an uncertified mechanism.
///
/// 10⁻¹⁰⁰ keeps a margin of more than 10⁴⁰ to every limit above, and any σ below it already has
/// ε ≥ 10¹⁰⁰ at every δ below the nearly blatant floor, so nothing useful is lost.
pub const MIN_CERTIFIED_NOISE_MULTIPLIER: f64 = 1e-100;

/// The path and value of the smallest Gaussian noise multiplier in `event` that lies in
/// (0, [`MIN_CERTIFIED_NOISE_MULTIPLIER`]); `None` when every σ is certified (σ ≤ 0, NaN and ∞ are
/// left to validation).
pub(crate) fn uncertified_noise(event: &DpEvent) -> Option<(String, f64)> {
    fn walk(e: &DpEvent, path: &mut String, best: &mut Option<(String, f64)>) {
        match e {
            DpEvent::Gaussian { noise_multiplier: s } | DpEvent::Laplace { noise_multiplier: s } => {
                if *s > 0.0 && *s < MIN_CERTIFIED_NOISE_MULTIPLIER && best.as_ref().is_none_or(|(_, b)| s < b) {
                    *best = Some((format!("{path}.noise_multiplier"), *s));
                }
            }
            DpEvent::PoissonSampled { event, .. }
            | DpEvent::SampledWithoutReplacement { event, .. }
            | DpEvent::SelfComposed { event, .. } => {
                let len = path.len();
                path.push_str(".event");
                walk(event, path, best);
                path.truncate(len);
            }
            DpEvent::Composed { events } => {
                for (i, ev) in events.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!(".events[{i}]"));
                    walk(ev, path, best);
                    path.truncate(len);
                }
            }
            DpEvent::NoOp | DpEvent::NonPrivate | DpEvent::EpsilonDelta { .. } => {}
        }
    }
    let mut best = None;
    walk(event, &mut "event".to_string(), &mut best);
    best
}

fn uncertified_result(kind: AccountantKind, at: (String, f64), epsilon: f64, delta: f64) -> Evidence {
    let (path, sigma) = at;
    Evidence::of(
        kind,
        epsilon,
        delta,
        if kind == AccountantKind::Clt {
            BoundKind::Estimate
        } else {
            BoundKind::UpperBound
        },
    )
    .with_detail("noise_multiplier", sigma)
    .with_diagnostic(
        "noise_below_certified_range",
        format!(
            "{path} = {sigma:e} is below {MIN_CERTIFIED_NOISE_MULTIPLIER:e}, the smallest noise multiplier whose \
             accounting is certified (the noise is too small to bound): no finite ε is certified, ε = ∞"
        ),
        true,
    )
}

/// ε = ∞ at `delta` when `event` holds a noise multiplier below the certified range (see
/// [`MIN_CERTIFIED_NOISE_MULTIPLIER`]); every accountant answers through this first.
pub(crate) fn uncertified_epsilon(kind: AccountantKind, event: &DpEvent, delta: f64) -> Option<Evidence> {
    uncertified_noise(event).map(|at| uncertified_result(kind, at, f64::INFINITY, delta))
}

/// δ = 1 at `epsilon` when `event` holds a noise multiplier below the certified range.
pub(crate) fn uncertified_delta(kind: AccountantKind, event: &DpEvent, epsilon: f64) -> Option<Evidence> {
    uncertified_noise(event).map(|at| uncertified_result(kind, at, epsilon, 1.0))
}

fn non_private_result(kind: AccountantKind, path: String, epsilon: f64, delta: f64) -> Evidence {
    Evidence::of(kind, epsilon, delta, BoundKind::Exact).with_diagnostic(
        "non_private",
        format!("{path} is non-private (no guarantee): no finite ε holds at any δ < 1, ε = ∞"),
        true,
    )
}

/// ε = ∞ at `delta` when `event` contains a [`DpEvent::NonPrivate`] anywhere (composed,
/// repeated or sampled: sampling with q > 0 keeps it non-private). Exact, hence sound. Every
/// accountant asks this before anything else, `supports` included.
pub(crate) fn non_private_epsilon(kind: AccountantKind, event: &DpEvent, delta: f64) -> Option<Evidence> {
    event
        .non_private_path()
        .map(|p| non_private_result(kind, p, f64::INFINITY, delta))
}

/// The answer of a degenerate-input guard ([`non_private_epsilon`], [`uncertified_epsilon`])
/// at each δ of `deltas`, once the guard has matched the event (it answers at every valid δ).
pub(crate) fn guarded_at_each(
    deltas: impl IntoIterator<Item = f64>,
    guard: impl Fn(f64) -> Option<Evidence>,
) -> Vec<Result<Evidence>> {
    deltas
        .into_iter()
        .map(|d| {
            check_delta(d)?;
            guard(d).ok_or_else(|| Error::numeric(format!("no guarded answer at δ = {d}")))
        })
        .collect()
}

/// δ = 1 at every finite `epsilon` when `event` contains a [`DpEvent::NonPrivate`].
pub(crate) fn non_private_delta(kind: AccountantKind, event: &DpEvent, epsilon: f64) -> Option<Evidence> {
    event
        .non_private_path()
        .map(|p| non_private_result(kind, p, epsilon, 1.0))
}

/// Why an accountant does not apply, in users' words: without the accountant's own name in
/// front (reports show it beside the reason) and without the position of the sub-event in the
/// event tree (`event.events[2].event: `), which means nothing for an event built from flags.
pub(crate) fn plain_reason(kind: AccountantKind, message: &str) -> String {
    let mut m = message.trim();
    let prefix = format!("{}: ", kind.as_str());
    if let Some(rest) = m.strip_prefix(&prefix) {
        m = rest;
    }
    if let Some((head, rest)) = m.split_once(": ") {
        let is_path = head.starts_with("event")
            && head
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']' | '_'));
        if is_path {
            m = rest;
        }
    }
    m.to_string()
}

#[cfg(test)]
mod non_private_tests {
    use super::*;

    /// A non-private part anywhere (Poisson-sampled with q > 0, repeated, composed with a
    /// Gaussian) gives ε = ∞ at every δ < 1 and δ = 1 at every finite ε, from every accountant.
    #[test]
    fn non_private_inside_poisson_sampling_is_still_infinite() {
        let events = [
            DpEvent::NonPrivate,
            DpEvent::poisson(1e-6, DpEvent::NonPrivate),
            DpEvent::Composed {
                events: vec![
                    DpEvent::dpsgd(1.1, 0.01, 100),
                    DpEvent::repeat(DpEvent::poisson(0.001, DpEvent::NonPrivate), 3),
                ],
            },
            DpEvent::SampledWithoutReplacement {
                n: 1000,
                m: 1,
                event: Box::new(DpEvent::NonPrivate),
            },
        ];
        for ev in &events {
            ev.validate().unwrap();
            assert!(ev.non_private_path().is_some(), "{ev:?}");
            for nb in [Neighbouring::AddRemove, Neighbouring::ReplaceOne] {
                for k in AccountantKind::ALL {
                    let acc = k.build();
                    acc.supports(ev, nb).unwrap_or_else(|e| panic!("{k:?} {ev:?}: {e}"));
                    for d in [1e-10, 1e-5, 0.5] {
                        let r = acc.epsilon(ev, nb, d).unwrap();
                        assert_eq!(r.epsilon, f64::INFINITY, "{k:?} {ev:?}");
                        assert!(r.kind.is_sound());
                        assert!(r.diagnostics.iter().any(|x| x.code == "non_private"));
                    }
                    let (head, grid) = acc.epsilon_profile(ev, nb, 1e-5, &[1e-3, 1e-7]);
                    assert_eq!(head.unwrap().epsilon, f64::INFINITY);
                    assert!(grid.into_iter().all(|r| r.unwrap().epsilon == f64::INFINITY));
                    for e in [0.0, 1.0, 100.0] {
                        assert_eq!(acc.delta(ev, nb, e).unwrap().delta, 1.0, "{k:?} {ev:?}");
                    }
                }
            }
        }
        assert_eq!(
            events[2].non_private_path().as_deref(),
            Some("event.events[1].event.event")
        );
        assert!(DpEvent::dpsgd(1.1, 0.01, 100).non_private_path().is_none());
    }

    #[test]
    fn non_private_reads_and_writes_as_non_private() {
        let ev: DpEvent = serde_json::from_str(r#"{"type": "non_private"}"#).unwrap();
        assert_eq!(ev, DpEvent::NonPrivate);
        assert_eq!(ev.type_name(), "non_private");
        assert_eq!(serde_json::to_string(&ev).unwrap(), r#"{"type":"non_private"}"#);
        assert_eq!(ev.ledger(), "non-private (no guarantee)\n");
    }
}

#[cfg(test)]
mod plain_reason_tests {
    use super::*;

    #[test]
    fn drops_the_accountant_name_and_the_tree_path() {
        assert_eq!(
            plain_reason(
                AccountantKind::Gdp,
                "gdp: event.event: subsampled events are not exactly GDP"
            ),
            "subsampled events are not exactly GDP"
        );
        assert_eq!(plain_reason(AccountantKind::Pld, "event.events[2].event: x: y"), "x: y");
        assert_eq!(plain_reason(AccountantKind::Rdp, "rdp: no: reason"), "no: reason");
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    #[test]
    fn an_epsilon_record_reads_back_and_names_who_computed_it() {
        let acc = Evidence::of(AccountantKind::Rdp, f64::INFINITY, 1e-5, BoundKind::UpperBound).with_detail("mu", 2.0);
        let v = serde_json::to_value(&acc).unwrap();
        assert_eq!(
            (v["method"].as_str(), v["accountant"].as_str(), v["epsilon"].as_str()),
            (Some("rdp"), Some("rdp"), Some("inf"))
        );
        assert!(v.get("diagnostics").is_none() && v.get("note").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<Evidence>(v).unwrap(), acc);
        let floor = Evidence::new("delta_floor", 0.5, 1e-5, BoundKind::LowerBound).with_note("why");
        let v = serde_json::to_value(&floor).unwrap();
        assert!(v.get("accountant").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<Evidence>(v).unwrap(), floor);
        // Written before μ moved into details; and a record naming no one is refused.
        let old: Evidence = serde_json::from_str(
            r#"{"method": "gdp", "accountant": "gdp", "epsilon": 1.0, "delta": 1e-5, "kind": "exact", "mu": 0.3}"#,
        )
        .unwrap();
        assert_eq!(old.mu(), Some(0.3));
        let e = serde_json::from_str::<Evidence>(r#"{"epsilon": 1.0, "delta": 1e-5, "kind": "exact"}"#).unwrap_err();
        assert!(e.to_string().contains("`method` or its `accountant`"), "{e}");
    }
}
