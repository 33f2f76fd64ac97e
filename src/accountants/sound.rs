//! The sound ε of an event at δ under a neighbouring relation — the tightest sound **upper**
//! bound and a sound **lower** bound, each naming the accountant and kind that produced it — and
//! the one verdict rule every command applies to a claim or a budget.
//!
//! Verdicts (docs/pipelines.md, "Verdicts"):
//! - `holds`: a sound upper bound (`exact` or `upper_bound`) on ε at the claimed δ is ≤ the claim;
//! - `violated`: a sound lower bound (`exact` or `lower_bound`) on the true ε at the claimed δ
//!   is > the claim;
//! - `not_demonstrated`: neither — the claim may be true, but nothing sound supports it.
//!
//! Upper bounds come from the GDP (exact for full-batch Gaussians), RDP and PLD accountants
//! (plus any theorem a pipeline adds with [`SoundEpsilon::push`]). Lower bounds come from
//! witnesses that are proven for the event's worst-case pair of neighbouring datasets:
//! - an exact value (GDP);
//! - the exact hockey-stick divergence of one step's worst-case pair (a composition is never
//!   more private than one of its steps: the other outputs can be ignored, post-processing);
//! - a proven δ floor from a threshold test: for the event E = "some step's output exceeds
//!   μᵢ − a", δ(ε) ≥ P(E) − e^ε Q(E) for every a (definition of (ε, δ)-DP), with
//!   P(E) ≥ 1 − Πᵢ (1 − pᵢΦ(a))^{cᵢ} and Q(E) ≤ Σᵢ cᵢ Φ̄(μᵢ − a). As μᵢ → ∞ this is the
//!   nearly-blatant floor δ ≥ 1 − Πᵢ (1 − pᵢ)^{cᵢ}, e.g. δ ≥ 1 − (1 − p)^T;
//! - the tail of the composed privacy loss, by exponential tilting and the Berry–Esseen theorem
//!   ([`super::tilted`]): for long compositions of weak steps (DP-SGD over 10⁵–10⁸ steps) it lies
//!   within a few per cent of the truth, where the two witnesses above see one step or none.
//!
//! The witnesses assume that the sensitivity Δ of every Gaussian leaf (noise multiplier = σ/Δ) is
//! attained, or approached, by some pair of neighbouring datasets — true for clipped sums and
//! for the means of unit vectors of the pipelines here (a supremum that is only approached gives
//! the same bound by continuity). Under add/remove a Poisson-subsampled step's pair is the
//! mixture (1 − p)N(0, 1) + pN(μ, 1) against N(0, 1) (and the reverse); sampling m of n without
//! replacement under replace-one has the same pair with p = m/n when the other records are equal
//! (Balle, Barthe & Gaboardi 2018, §5); a full-batch Gaussian's pair is N(μ, 1) against N(0, 1).
//! Poisson sampling under replace-one and (ε, δ) leaves give no witness here (they are skipped,
//! which only weakens the lower bound: a composition is at least as leaky as any part of it).
//!
//! Lower bounds are rounded *down* (relative 1e-9) so that floating point can only weaken them.

use serde::{Deserialize, Serialize};

use super::{AccountantKind, BoundKind};
use crate::events::{Component, DpEvent, Mechanism, Neighbouring, Sampling};
use crate::numeric;

/// Relative amount by which lower bounds are lowered so rounding cannot raise them.
const LOWER_DEFLATE: f64 = 1e-9;

pub use super::Evidence;

/// Everything sound known about ε of one event at one δ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoundEpsilon {
    /// δ at which every number holds.
    pub delta: f64,
    /// The neighbouring relation accounted.
    pub neighbouring: Neighbouring,
    /// The tightest (smallest) sound upper bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<Evidence>,
    /// The largest sound lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<Evidence>,
    /// Every number computed (upper and lower bounds, and any estimate shown beside them).
    pub analyses: Vec<Evidence>,
    /// Accountants or witnesses that could not be applied, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

impl SoundEpsilon {
    /// Nothing known yet.
    pub fn empty(neighbouring: Neighbouring, delta: f64) -> Self {
        SoundEpsilon {
            delta,
            neighbouring,
            upper: None,
            lower: None,
            analyses: Vec::new(),
            unavailable: Vec::new(),
        }
    }

    /// Adds one analysis; an upper bound tighter than the current one (or a lower bound larger
    /// than the current one) takes its place. Evidence at a δ other than this one's never
    /// decides: an upper bound at δ' ≤ δ is still an upper bound at δ, a lower bound at δ' ≥ δ
    /// is still a lower bound at δ; anything else is recorded only.
    pub fn push(&mut self, e: Evidence) {
        if e.is_upper() && e.delta <= self.delta && self.upper.as_ref().is_none_or(|u| e.epsilon < u.epsilon) {
            self.upper = Some(e.clone());
        }
        if e.is_lower() && e.delta >= self.delta && self.lower.as_ref().is_none_or(|l| e.epsilon > l.epsilon) {
            self.lower = Some(e.clone());
        }
        self.analyses.push(e);
    }

    /// The same numbers read for a mechanism that the accounted event only over-approximates
    /// (e.g. shuffled batches accounted as full-batch steps with no amplification): every
    /// upper bound on the event's ε stays an upper bound on the mechanism's, and an exact value
    /// becomes one; a lower bound on the event's ε says nothing about the mechanism, so lower
    /// bounds are dropped (named in `unavailable` with `why`) and can never decide `violated`.
    pub fn as_upper_bounds_of(self, why: &str) -> SoundEpsilon {
        let mut out = SoundEpsilon::empty(self.neighbouring, self.delta);
        out.unavailable = self.unavailable;
        for mut e in self.analyses {
            match e.kind {
                BoundKind::LowerBound => {
                    out.unavailable.push(format!(
                        "{}: {} is a lower bound of the accounted event only ({why})",
                        e.source(),
                        e.describe()
                    ));
                    continue;
                }
                BoundKind::Exact => e.kind = BoundKind::UpperBound,
                _ => {}
            }
            out.push(e);
        }
        out
    }

    /// The verdict on a claim "ε ≤ `claimed`" at this δ.
    pub fn decide(&self, claimed: f64) -> Decision {
        decide(claimed, self)
    }
}

/// The one verdict of dpaudit: on a claim, a budget, an implementation audit, and on a whole
/// command (a batch answers its worst item). Ordered from best to worst, so that
/// [`Verdict::worst`] is the maximum.
///
/// Its one mapping to the process exit status is [`Verdict::exit_code`] (docs/reliability.md,
/// "Exit codes"): `holds` 0, `not_demonstrated` 1, `violated` 1, `unanswered` 2. A command that
/// judges nothing (`account`, `analyze`, …) answers `holds`: nothing it was asked is
/// contradicted.
///
/// Reports keep their own words for a checked budget or claim ([`Verdict::status_word`]:
/// `pass`, `fail`, `inconclusive`; `PASS`, … in text): the JSON schema of `verdicts[].status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A sound upper bound at the claimed δ is ≤ the claimed ε (a budget: the tightest sound
    /// upper bound is within it); or the command judged nothing.
    Holds,
    /// Neither: nothing sound decides (a CI guard treats it like a violation).
    NotDemonstrated,
    /// A sound lower bound on the true ε at the claimed δ exceeds the claimed ε; a budget whose
    /// tightest sound upper bound exceeds it (`check` errs safe); an audit that caught its
    /// implementation.
    Violated,
    /// The question could not be answered from the input (bad input, or no sound accountant
    /// applies to a budget), reported on stderr.
    Unanswered,
}

impl Verdict {
    /// Every verdict, best first.
    pub const ALL: [Verdict; 4] = [
        Verdict::Holds,
        Verdict::NotDemonstrated,
        Verdict::Violated,
        Verdict::Unanswered,
    ];

    /// `holds`, `not_demonstrated`, `violated`, `unanswered` (claims' JSON, CSV and text).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::NotDemonstrated => "not_demonstrated",
            Verdict::Violated => "violated",
            Verdict::Unanswered => "unanswered",
        }
    }

    /// The process exit status of a command whose answer is this verdict, the one mapping
    /// (docs/reliability.md, "Exit codes"): 0 holds; 1 violated or not demonstrated; 2 unanswered
    /// (usage or input error, or a budget no sound accountant can check).
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Holds => 0,
            Verdict::NotDemonstrated | Verdict::Violated => 1,
            Verdict::Unanswered => 2,
        }
    }

    /// The worse of two verdicts (a batch is as bad as its worst item).
    pub fn worst(self, other: Verdict) -> Verdict {
        self.max(other)
    }

    /// The word of a report's verdict row (`verdicts[].status` in JSON): `pass` (holds), `fail`
    /// (violated), `inconclusive` (not demonstrated, or unanswered).
    pub fn status_word(self) -> &'static str {
        match self {
            Verdict::Holds => "pass",
            Verdict::Violated => "fail",
            Verdict::NotDemonstrated | Verdict::Unanswered => "inconclusive",
        }
    }

    /// [`Self::status_word`] for a terminal: `PASS`, `FAIL`, `INCONCLUSIVE`.
    pub(crate) fn shouted(self) -> &'static str {
        match self {
            Verdict::Holds => "PASS",
            Verdict::Violated => "FAIL",
            Verdict::NotDemonstrated | Verdict::Unanswered => "INCONCLUSIVE",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Serde for a report's verdict row: the verdict as its [`Verdict::status_word`] (`pass`,
/// `fail`, `inconclusive`), read back as holds, violated, not demonstrated.
pub(crate) mod status_word {
    use super::Verdict;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &Verdict, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(v.status_word())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Verdict, D::Error> {
        let w = String::deserialize(d)?;
        match w.as_str() {
            "pass" => Ok(Verdict::Holds),
            "fail" => Ok(Verdict::Violated),
            "inconclusive" => Ok(Verdict::NotDemonstrated),
            other => Err(serde::de::Error::unknown_variant(
                other,
                &["pass", "fail", "inconclusive"],
            )),
        }
    }
}

/// A verdict with the evidence that decides it: the upper bound for `holds`, the lower bound
/// for `violated`, and for `not_demonstrated` the best upper bound (if any) that failed to show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The verdict.
    pub verdict: Verdict,
    /// The claimed ε (or budget).
    pub claimed_epsilon: f64,
    /// The claimed δ.
    pub delta: f64,
    /// The deciding number (see the type's docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    /// The best sound lower bound, when it does not decide (shown beside the evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<Evidence>,
    /// One sentence saying why.
    pub reason: String,
}

/// The verdict rule (module docs). A violation needs a lower bound *strictly* above the claim;
/// holding needs an upper bound at or below it.
pub fn decide(claimed: f64, s: &SoundEpsilon) -> Decision {
    let claim = show(claimed);
    if let Some(u) = s.upper.as_ref().filter(|u| u.epsilon <= claimed) {
        return Decision {
            verdict: Verdict::Holds,
            claimed_epsilon: claimed,
            delta: s.delta,
            evidence: Some(u.clone()),
            lower: s.lower.clone(),
            reason: format!("sound upper bound {} ≤ claimed ε = {claim}", u.describe()),
        };
    }
    if let Some(l) = s.lower.as_ref().filter(|l| l.epsilon > claimed) {
        return Decision {
            verdict: Verdict::Violated,
            claimed_epsilon: claimed,
            delta: s.delta,
            evidence: Some(l.clone()),
            lower: None,
            reason: format!(
                "sound lower bound {} > claimed ε = {claim}{}",
                l.describe(),
                if l.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", l.note)
                }
            ),
        };
    }
    let reason = match (&s.upper, &s.lower) {
        (Some(u), Some(l)) => format!(
            "the true ε lies between the lower bound {} and the upper bound {}; the claim ε = {claim} is in between",
            l.describe(),
            u.describe()
        ),
        (Some(u), None) => format!(
            "the best sound upper bound {} exceeds the claim ε = {claim}, and no lower bound shows a violation",
            u.describe()
        ),
        (None, _) => format!(
            "no sound upper bound on ε is available{}",
            if s.unavailable.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.unavailable.join("; "))
            }
        ),
    };
    Decision {
        verdict: Verdict::NotDemonstrated,
        claimed_epsilon: claimed,
        delta: s.delta,
        evidence: s.upper.clone(),
        lower: s.lower.clone(),
        reason,
    }
}

/// The item with the smallest sound (exact or upper-bound) value among `items`, where `value`
/// gives each item's number and kind (`None`: no number): the one loop every command uses to
/// pick its headline or check a budget. Estimates, lower bounds and data-dependent numbers never
/// win; NaN never wins. `None` when no sound number exists.
pub fn tightest_by<T, F: Fn(&T) -> Option<(f64, BoundKind)>>(
    items: impl IntoIterator<Item = T>,
    value: F,
) -> Option<T> {
    items
        .into_iter()
        .filter_map(|t| match value(&t) {
            Some((v, k)) if k.is_sound() && !v.is_nan() => Some((v, t)),
            _ => None,
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, t)| t)
}

/// The smallest sound ε among accountant results ([`tightest_by`] on ε).
pub(crate) fn tightest_upper<'a, I: IntoIterator<Item = &'a Evidence>>(results: I) -> Option<&'a Evidence> {
    tightest_by(results, |r| Some((r.epsilon, r.kind)))
}

/// The smallest sound δ among accountant results (a δ(ε) query; [`tightest_by`] on δ).
pub(crate) fn tightest_upper_delta<'a, I: IntoIterator<Item = &'a Evidence>>(results: I) -> Option<&'a Evidence> {
    tightest_by(results, |r| Some((r.delta, r.kind)))
}

/// The sound upper bounds (GDP, RDP, PLD) and lower bounds (module docs) on ε of `event` at
/// `delta` under `neighbouring`. Accountants that do not support the event are listed in
/// `unavailable` (GDP silently: it is exact only for full-batch Gaussians).
pub fn sound_epsilon(event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> SoundEpsilon {
    let mut s = SoundEpsilon::empty(neighbouring, delta);
    for kind in [AccountantKind::Gdp, AccountantKind::Rdp, AccountantKind::Pld] {
        let acc = kind.build();
        if let Err(e) = acc.supports(event, neighbouring) {
            if kind != AccountantKind::Gdp {
                s.unavailable.push(prefixed(kind, &e.message));
            }
            continue;
        }
        match acc.epsilon(event, neighbouring, delta) {
            Ok(r) => {
                let e = r.cited();
                // The GDP value is exact: it is also the best lower bound (rounded down).
                if r.kind == BoundKind::Exact && r.epsilon.is_finite() {
                    s.push(
                        Evidence::new("gdp_exact_lower", lower_round(r.epsilon), delta, BoundKind::LowerBound)
                            .with_accountant(kind)
                            .with_note("the exact GDP value, rounded down"),
                    );
                }
                s.push(e);
            }
            Err(e) => s.unavailable.push(prefixed(kind, &e.message)),
        }
    }
    for w in lower_witnesses(event, neighbouring, delta) {
        s.push(w);
    }
    s
}

/// Adds the CLT estimate of `event` to `s` (shown, never deciding), when the CLT applies.
pub(crate) fn add_clt_estimate(s: &mut SoundEpsilon, event: &DpEvent) {
    let acc = AccountantKind::Clt.build();
    match acc
        .supports(event, s.neighbouring)
        .and_then(|_| acc.epsilon(event, s.neighbouring, s.delta))
    {
        Ok(r) => {
            let e = r
                .cited()
                .with_note("CLT (Dong, Roth & Su 2022, Thm 3.5): an estimate, never a bound");
            s.push(e);
        }
        Err(e) => s.unavailable.push(prefixed(AccountantKind::Clt, &e.message)),
    }
}

fn prefixed(kind: AccountantKind, message: &str) -> String {
    format!("{}: {}", kind.as_str(), super::plain_reason(kind, message))
}

/// A number for messages: six significant digits, `∞` for infinity.
pub fn show(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "∞".into() } else { "−∞".into() };
    }
    if x == 0.0 || x.is_nan() {
        return format!("{x}");
    }
    let a = x.abs();
    if (1e-4..1e6).contains(&a) {
        let digits = (5 - a.log10().floor() as i32).clamp(0, 10) as usize;
        let s = format!("{x:.digits$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        format!("{x:.5e}")
    }
}

/// `x` lowered by [`LOWER_DEFLATE`] (relative) so floating point cannot raise a lower bound.
fn lower_round(x: f64) -> f64 {
    if x <= 0.0 {
        0.0
    } else {
        x * (1.0 - LOWER_DEFLATE)
    }
}

/// One Gaussian use in the witness pair: inclusion probability p, μ = 1/noise multiplier,
/// count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairStep {
    /// Probability that the differing record takes part (1 for full batch).
    pub p: f64,
    /// μ = Δ/σ of the Gaussian when it takes part.
    pub mu: f64,
    /// How many times this step runs.
    pub count: u64,
}

/// The Gaussian steps of `event` that have a worst-case pair under `neighbouring` (module docs);
/// the others are skipped (the bound then ignores them, which is still sound).
pub fn pair_steps(event: &DpEvent, neighbouring: Neighbouring) -> Vec<PairStep> {
    let Ok(comps) = event.components() else {
        return Vec::new();
    };
    comps.iter().filter_map(|c| pair_step(c, neighbouring)).collect()
}

fn pair_step(c: &Component, nb: Neighbouring) -> Option<PairStep> {
    let Mechanism::Gaussian { noise_multiplier } = c.mechanism else {
        return None;
    };
    if noise_multiplier.is_nan() || noise_multiplier <= 0.0 || c.count == 0 {
        return None;
    }
    let mu = 1.0 / noise_multiplier;
    let p = match (c.sampling, nb) {
        (Sampling::Full, _) => 1.0,
        (Sampling::Poisson { q }, Neighbouring::AddRemove) => q,
        (Sampling::WithoutReplacement { n, m }, Neighbouring::ReplaceOne) => m as f64 / n as f64,
        _ => return None,
    };
    Some(PairStep { p, mu, count: c.count })
}

/// ln P(E) lower bound and ln Q(E) upper bound of the threshold test at offset `a`.
fn threshold_test(steps: &[PairStep], a: f64) -> (f64, f64) {
    let phi_a = numeric::ndtr(a);
    let log1m_p: f64 = steps.iter().map(|s| s.count as f64 * (-s.p * phi_a).ln_1p()).sum();
    let p_lb = -log1m_p.exp_m1();
    let terms: Vec<f64> = steps
        .iter()
        .map(|s| (s.count as f64).ln() + numeric::log_ndtr_sf(s.mu - a))
        .collect();
    let ln_q = numeric::log_sum_exp(&terms).min(0.0);
    (p_lb.ln(), ln_q)
}

fn offsets(steps: &[PairStep]) -> Vec<f64> {
    let hi = steps.iter().map(|s| s.mu).fold(0.0f64, f64::max) + 10.0;
    let hi = hi.min(60.0);
    let n = 800;
    (0..=n).map(|i| -10.0 + (hi + 10.0) * i as f64 / n as f64).collect()
}

/// A proven lower bound on δ(ε) of the steps' composition: max over threshold offsets a of
/// P(E) − e^ε Q(E) (module docs), lowered slightly for rounding. 0 when the test shows nothing.
pub fn delta_floor(steps: &[PairStep], epsilon: f64) -> f64 {
    if steps.is_empty() {
        return 0.0;
    }
    let mut best = 0.0f64;
    for a in offsets(steps) {
        let (ln_p, ln_q) = threshold_test(steps, a);
        let v = ln_p.exp() - (epsilon + ln_q).exp();
        best = best.max(v);
    }
    (best * (1.0 - 1e-9) - 1e-300).max(0.0)
}

/// The largest ε certified by the threshold test at `delta`: max over a of
/// ln(P(E) − δ) − ln Q(E), lowered for rounding; `None` when P(E) ≤ δ for every a.
pub(crate) fn threshold_epsilon_lower(steps: &[PairStep], delta: f64) -> Option<f64> {
    let mut best: Option<f64> = None;
    for a in offsets(steps) {
        let (ln_p, ln_q) = threshold_test(steps, a);
        let p = ln_p.exp();
        if p > delta {
            let e = (p - delta).ln() - ln_q;
            if e > 0.0 && e.is_finite() {
                best = Some(best.map_or(e, |b: f64| b.max(e)));
            }
        }
    }
    best.map(lower_round)
}

/// The largest ε with the exact δ of one step's worst-case pair above `delta` (that step's
/// privacy loss alone already costs that much); `None` when it is 0.
pub(crate) fn single_pair_epsilon_lower(step: PairStep, delta: f64) -> Option<f64> {
    let z = 1.0 / step.mu;
    let d = |e: f64| crate::accountants::pld::single_step_delta_exact(step.p.min(1.0), z, e);
    if d(0.0) <= delta {
        return None;
    }
    let mut hi = 1.0;
    while d(hi) > delta {
        hi *= 2.0;
        if hi > 1e7 {
            return None;
        }
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if d(mid) > delta {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-12 * hi.max(1e-12) {
            break;
        }
    }
    (lo > 0.0).then(|| lower_round(lo))
}

/// Every lower-bound witness available for `event` at `delta` (module docs).
pub fn lower_witnesses(event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Vec<Evidence> {
    let steps = pair_steps(event, neighbouring);
    let mut out = Vec::new();
    if steps.is_empty() {
        return out;
    }
    if let Some(e) = threshold_epsilon_lower(&steps, delta) {
        let blatant = -steps
            .iter()
            .map(|s| s.count as f64 * (-s.p).ln_1p())
            .sum::<f64>()
            .exp_m1();
        out.push(
            Evidence::new("delta_floor", e, delta, BoundKind::LowerBound).with_note(format!(
                "proven δ floor: the event \"some step's output exceeds μᵢ − a\" has P(E) − e^ε Q(E) > δ; \
                 as steps become sharp the floor tends to δ ≥ 1 − Π(1 − pᵢ)^cᵢ = {}",
                show(blatant)
            )),
        );
    }
    if let Some(best) = steps
        .iter()
        .copied()
        .max_by(|a, b| (a.p * a.mu).total_cmp(&(b.p * b.mu)))
    {
        if let Some(e) = single_pair_epsilon_lower(best, delta) {
            out.push(
                Evidence::new("worst_case_pair", e, delta, BoundKind::LowerBound).with_note(format!(
                    "exact δ of one step's worst-case pair ((1 − p)N(0,1) + pN(μ,1) vs N(0,1), p = {}, μ = {}): \
                     the composition is at least as leaky as one of its steps",
                    show(best.p),
                    show(best.mu)
                )),
            );
        }
    }
    if let Some(l) = super::pld_lower::epsilon_lower(&steps, delta, 1e-4) {
        let left_out = if l.left_out > 0 {
            format!(
                "; {} of {} distinct steps left out (μ > {} or beyond the {} leakiest), which only weakens it",
                l.left_out,
                l.left_out + l.used,
                super::pld_lower::MAX_MU,
                super::pld_lower::MAX_DISTINCT
            )
        } else {
            String::new()
        };
        out.push(
            Evidence::new("pld_lower", lower_round(l.epsilon), delta, BoundKind::LowerBound).with_note(format!(
                "PLD on the optimistic side ({} direction, grid {}): each step garbled into loss bins whose \
                 loss lies on the grid, masses rounded down, aliasing and round-off subtracted{left_out}",
                l.direction.as_str(),
                show(l.grid_interval)
            )),
        );
    }
    if let Some(t) = super::tilted::composed_epsilon_lower(&steps, delta) {
        let left_out = if t.left_out > 0 {
            format!(
                "; {} of {} distinct steps left out (μ > {} or beyond the {} leakiest), which only weakens it",
                t.left_out,
                t.left_out + t.used,
                super::tilted::MAX_MU,
                super::tilted::MAX_DISTINCT
            )
        } else {
            String::new()
        };
        out.push(
            Evidence::new("tilted_tail", lower_round(t.epsilon), delta, BoundKind::LowerBound).with_note(format!(
                "tail of the composed privacy loss by exponential tilting (θ = {}) and Berry–Esseen: \
                 δ({}) ≥ {} > δ{left_out}",
                show(t.theta),
                show(t.epsilon),
                show(t.delta_lower)
            )),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountants::gdp;

    #[test]
    fn full_batch_gaussian_has_exact_upper_and_lower() {
        let ev = DpEvent::repeat(DpEvent::gaussian(2.0), 4);
        let s = sound_epsilon(&ev, Neighbouring::AddRemove, 1e-5);
        let exact = gdp::epsilon_for_delta(1.0, 1e-5).unwrap();
        let u = s.upper.as_ref().unwrap();
        let l = s.lower.as_ref().unwrap();
        assert_eq!(u.accountant, Some(AccountantKind::Gdp));
        assert_eq!(u.kind, BoundKind::Exact);
        assert!(u.epsilon >= exact && l.epsilon <= exact && l.epsilon > exact * (1.0 - 1e-6));
    }

    /// DP-SGD over 10⁷ steps (q = 0.004, σ = 1.1): the tilted tail witness certifies ε > 158
    /// (docs/pld.md), so a claim of ε = 100 is *violated* with a sound lower bound, where the
    /// one-step witnesses alone leave it not demonstrated.
    #[test]
    fn long_dpsgd_claim_below_the_tilted_tail_is_violated() {
        let ev = DpEvent::dpsgd(1.1, 0.004, 10_000_000);
        let w = lower_witnesses(&ev, Neighbouring::AddRemove, 1e-5);
        let t = w.iter().find(|e| e.method == "tilted_tail").expect("tilted witness");
        assert!(t.epsilon > 158.0 && t.epsilon < 162.465, "{t:?}");
        assert!(
            w.iter()
                .filter(|e| e.method != "tilted_tail" && e.method != "pld_lower")
                .all(|e| e.epsilon < 100.0),
            "{w:?}"
        );
        // The optimistic PLD is tighter still: within 0.1 % of the PLD upper bound 162.465.
        let p = w.iter().find(|e| e.method == "pld_lower").expect("pld_lower witness");
        assert!(p.epsilon > 0.999 * 162.465 && p.epsilon < 162.465, "{p:?}");
        let s = sound_epsilon(&ev, Neighbouring::AddRemove, 1e-5);
        let d = s.decide(100.0);
        assert_eq!(d.verdict, Verdict::Violated);
        assert_eq!(d.evidence.unwrap().method, "pld_lower");
        // And a claim above the PLD bound holds.
        assert_eq!(s.decide(170.0).verdict, Verdict::Holds);
    }

    /// q = 0.01, σ = 1, T = 1,000, δ = 1e-5: dp_accounting 0.6.0's pessimistic PLD at grid 1e-5
    /// gives 1.8282367 (fixtures/reference/pld_near_truth.csv). Claims 0.5 % either side are
    /// decided: below by the optimistic PLD (the tilted tail and the one-step witnesses do not
    /// reach it), above by the PLD upper bound; the two bounds bracket the reference.
    #[test]
    fn claims_half_a_percent_from_the_truth_are_decided_at_1000_steps() {
        let truth = 1.8282367367;
        let ev = DpEvent::dpsgd(1.0, 0.01, 1000);
        let s = sound_epsilon(&ev, Neighbouring::AddRemove, 1e-5);
        let lo = s.lower.as_ref().unwrap();
        assert_eq!(lo.method, "pld_lower", "{s:?}");
        assert!(lo.epsilon <= truth && lo.epsilon > 0.995 * truth, "{lo:?}");
        let d = s.decide(0.995 * truth);
        assert_eq!(d.verdict, Verdict::Violated, "{d:?}");
        assert_eq!(s.decide(1.005 * truth).verdict, Verdict::Holds);
    }

    #[test]
    fn decide_needs_the_right_side() {
        let mut s = SoundEpsilon::empty(Neighbouring::AddRemove, 1e-5);
        s.push(Evidence::new("rdp", 3.0, 1e-5, BoundKind::UpperBound));
        s.push(Evidence::new("delta_floor", 1.0, 1e-5, BoundKind::LowerBound));
        s.push(Evidence::new("clt", 0.1, 1e-5, BoundKind::Estimate));
        assert_eq!(s.decide(3.0).verdict, Verdict::Holds);
        assert_eq!(s.decide(2.0).verdict, Verdict::NotDemonstrated);
        // An estimate below the claim never makes it hold; an upper bound above never violates.
        assert_eq!(s.decide(0.5).verdict, Verdict::Violated);
        assert_eq!(s.decide(0.5).evidence.unwrap().method, "delta_floor");
        // Evidence at a larger δ is not an upper bound at this δ.
        let mut t = SoundEpsilon::empty(Neighbouring::AddRemove, 1e-5);
        t.push(Evidence::new("x", 0.1, 1e-3, BoundKind::UpperBound));
        assert_eq!(t.decide(1.0).verdict, Verdict::NotDemonstrated);
    }

    #[test]
    fn nearly_blatant_floor_matches_one_minus_power() {
        // T = 10⁴ uses of a step with μ = 700 at p = 2e-5: δ ≥ 1 − (1 − p)^T ≈ 0.1813 at any
        // moderate ε (diffusion-sampling-privacy Table 4, p = 2e-5 rows).
        let steps = [PairStep {
            p: 2e-5,
            mu: 700.0,
            count: 10_000,
        }];
        let floor = delta_floor(&steps, 3.849);
        let blatant = 1.0 - (1.0f64 - 2e-5).powi(10_000);
        assert!(floor > 0.18 && floor <= blatant, "{floor} vs {blatant}");
        assert!(threshold_epsilon_lower(&steps, 1e-5).unwrap() > 1000.0);
        // A mild step certifies nothing at this δ.
        let mild = [PairStep {
            p: 0.01,
            mu: 0.5,
            count: 100,
        }];
        assert!(threshold_epsilon_lower(&mild, 1e-5).unwrap_or(0.0) < 1.0);
    }

    #[test]
    fn lower_bounds_stay_below_the_pld_upper_bound() {
        // Poisson(0.01) ∘ Gaussian(0.8) × 200: every witness must be ≤ the PLD upper bound.
        let ev = DpEvent::dpsgd(0.8, 0.01, 200);
        let s = sound_epsilon(&ev, Neighbouring::AddRemove, 1e-5);
        let u = s.upper.as_ref().unwrap().epsilon;
        for a in s.analyses.iter().filter(|a| a.kind == BoundKind::LowerBound) {
            assert!(a.epsilon <= u, "{} = {} > upper {u}", a.method, a.epsilon);
        }
        assert!(s.lower.is_some());
    }

    #[test]
    fn each_verdict_has_its_documented_exit_status_and_words() {
        // docs/reliability.md, "Exit codes": holds 0, not_demonstrated 1, violated 1,
        // unanswered 2; report rows pass / inconclusive / fail / inconclusive.
        let want = [
            (Verdict::Holds, 0, "holds", "pass", "PASS"),
            (
                Verdict::NotDemonstrated,
                1,
                "not_demonstrated",
                "inconclusive",
                "INCONCLUSIVE",
            ),
            (Verdict::Violated, 1, "violated", "fail", "FAIL"),
            (Verdict::Unanswered, 2, "unanswered", "inconclusive", "INCONCLUSIVE"),
        ];
        assert_eq!(want.map(|w| w.0), Verdict::ALL);
        for (v, code, word, status, shouted) in want {
            assert_eq!(v.exit_code(), code, "{v}");
            assert_eq!(v.as_str(), word);
            assert_eq!(serde_json::to_value(v).unwrap(), word);
            assert_eq!(v.status_word(), status);
            assert_eq!(v.shouted(), shouted);
        }
        // A batch answers its worst item.
        assert_eq!(Verdict::Holds.worst(Verdict::Violated), Verdict::Violated);
        assert_eq!(Verdict::Violated.worst(Verdict::NotDemonstrated), Verdict::Violated);
        assert_eq!(Verdict::Violated.worst(Verdict::Unanswered), Verdict::Unanswered);
    }
}
