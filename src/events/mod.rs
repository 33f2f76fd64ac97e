//! The DpEvent tree: *what happened*, kept apart from *how it is accounted*.
//!
//! Contract (as dp_accounting's `dp_event.py`): a variant's meaning never changes; new kinds of
//! events are added as new variants. `Gaussian { noise_multiplier }` means noise with standard
//! deviation `noise_multiplier × Δ₂`, where Δ₂ is the L2 sensitivity under the stated
//! [`Neighbouring`] relation.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::{Error, Result};

/// Which datasets are neighbours. Stated explicitly with every accounted event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Neighbouring {
    /// D' = D ∪ {x} or D \ {x} (the relation Poisson subsampling amplifies under).
    #[default]
    AddRemove,
    /// D' = D with one record replaced (the relation sampling without replacement needs).
    ReplaceOne,
}

impl fmt::Display for Neighbouring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Neighbouring::AddRemove => "add/remove one",
            Neighbouring::ReplaceOne => "replace one",
        })
    }
}

/// An immutable tree describing the privacy-relevant operations that ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DpEvent {
    /// Nothing that touches private data.
    NoOp,
    /// A mechanism with no privacy guarantee (dp_accounting's `NonPrivateDpEvent`): every
    /// accountant answers ε = ∞ (δ = 1) for any event that contains it.
    NonPrivate,
    /// Gaussian mechanism with noise std = `noise_multiplier` × L2 sensitivity.
    /// A μ-GDP step is `Gaussian { noise_multiplier: 1/μ }`.
    Gaussian {
        /// Noise standard deviation divided by the L2 sensitivity (σ).
        noise_multiplier: f64,
    },
    /// A mechanism known only to be (ε, δ)-DP.
    EpsilonDelta {
        /// ε of the mechanism.
        epsilon: f64,
        /// δ of the mechanism.
        delta: f64,
    },
    /// Laplace mechanism with noise scale b = `noise_multiplier` × L1 sensitivity.
    Laplace {
        /// Noise scale b divided by the L1 sensitivity.
        noise_multiplier: f64,
    },
    /// Each record is included independently with probability `q`, then `event` runs.
    PoissonSampled {
        /// Inclusion probability in (0, 1]. Also read as `sample_rate` (Opacus' name) and
        /// `sampling_probability` (dp_accounting's).
        #[serde(alias = "sample_rate", alias = "sampling_probability")]
        q: f64,
        /// What runs on the sample.
        event: Box<DpEvent>,
    },
    /// A uniformly random subset of exactly `m` of the `n` records, then `event` runs.
    SampledWithoutReplacement {
        /// Dataset size.
        n: u64,
        /// Sample size.
        m: u64,
        /// What runs on the sample.
        event: Box<DpEvent>,
    },
    /// The events run one after another (adaptively).
    Composed {
        /// The events, in order.
        events: Vec<DpEvent>,
    },
    /// `event` runs `count` times.
    SelfComposed {
        /// What runs.
        event: Box<DpEvent>,
        /// How many times.
        count: u64,
    },
}

/// How a homogeneous component is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Sampling {
    /// Every record takes part.
    Full,
    /// Each record independently with probability `q`.
    Poisson {
        /// Inclusion probability in (0, 1].
        q: f64,
    },
    /// Exactly `m` of the `n` records, uniformly.
    WithoutReplacement {
        /// Dataset size.
        n: u64,
        /// Sample size.
        m: u64,
    },
}

/// A privacy-costing leaf.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Mechanism {
    /// Gaussian noise with std = `noise_multiplier` × L2 sensitivity.
    Gaussian {
        /// Noise standard deviation divided by the L2 sensitivity (σ).
        noise_multiplier: f64,
    },
    /// A mechanism known only to be (ε, δ)-DP.
    EpsilonDelta {
        /// ε of the mechanism.
        epsilon: f64,
        /// δ of the mechanism.
        delta: f64,
    },
    /// Laplace noise with scale b = `noise_multiplier` × L1 sensitivity.
    Laplace {
        /// Noise scale b divided by the L1 sensitivity.
        noise_multiplier: f64,
    },
}

/// One homogeneous part of a pipeline: a (possibly sampled) mechanism run `count` times.
/// Most accountants work on the list of components ([`DpEvent::components`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Component {
    /// How the component is sampled.
    pub sampling: Sampling,
    /// The mechanism that runs.
    pub mechanism: Mechanism,
    /// How many times it runs.
    pub count: u64,
}

impl DpEvent {
    /// A Gaussian step with noise multiplier σ.
    pub fn gaussian(noise_multiplier: f64) -> Self {
        DpEvent::Gaussian { noise_multiplier }
    }
    /// A μ-GDP Gaussian step (noise multiplier 1/μ).
    pub fn gdp(mu: f64) -> Self {
        DpEvent::Gaussian {
            noise_multiplier: 1.0 / mu,
        }
    }
    /// `event` run on a Poisson(q) sample.
    pub fn poisson(q: f64, event: DpEvent) -> Self {
        DpEvent::PoissonSampled {
            q,
            event: Box::new(event),
        }
    }
    /// `event` run `count` times.
    pub fn repeat(event: DpEvent, count: u64) -> Self {
        DpEvent::SelfComposed {
            event: Box::new(event),
            count,
        }
    }
    /// The DP-SGD shape: `steps` × Poisson(q) ∘ Gaussian(σ).
    pub fn dpsgd(noise_multiplier: f64, q: f64, steps: u64) -> Self {
        let step = if q >= 1.0 {
            Self::gaussian(noise_multiplier)
        } else {
            Self::poisson(q, Self::gaussian(noise_multiplier))
        };
        Self::repeat(step, steps)
    }

    /// Short name of the variant, as in the serialised `type`.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            DpEvent::NoOp => "no_op",
            DpEvent::NonPrivate => "non_private",
            DpEvent::Gaussian { .. } => "gaussian",
            DpEvent::EpsilonDelta { .. } => "epsilon_delta",
            DpEvent::Laplace { .. } => "laplace",
            DpEvent::PoissonSampled { .. } => "poisson_sampled",
            DpEvent::SampledWithoutReplacement { .. } => "sampled_without_replacement",
            DpEvent::Composed { .. } => "composed",
            DpEvent::SelfComposed { .. } => "self_composed",
        }
    }

    /// Checks every parameter once (validate once, then trust). Errors name the path of the
    /// offending field, e.g. `event.events[1].q`.
    pub fn validate(&self) -> Result<()> {
        // The size of the tree first: every accountant walks it and keeps per-part state.
        crate::limits::check_count(
            "event (events in the tree)",
            self.node_count(),
            crate::limits::EVENT_PART,
        )?;
        self.validate_at(&Path::Root)
    }

    /// Number of nodes of the tree (this one included).
    pub(crate) fn node_count(&self) -> u64 {
        match self {
            DpEvent::NoOp
            | DpEvent::NonPrivate
            | DpEvent::Gaussian { .. }
            | DpEvent::Laplace { .. }
            | DpEvent::EpsilonDelta { .. } => 1,
            DpEvent::PoissonSampled { event, .. }
            | DpEvent::SampledWithoutReplacement { event, .. }
            | DpEvent::SelfComposed { event, .. } => 1 + event.node_count(),
            DpEvent::Composed { events } => 1 + events.iter().map(DpEvent::node_count).sum::<u64>(),
        }
    }

    fn validate_at(&self, path: &Path<'_>) -> Result<()> {
        let bad = |field: &str, msg: String| Err(Error::field(format!("{path}.{field}"), msg));
        match self {
            DpEvent::NoOp | DpEvent::NonPrivate => Ok(()),
            DpEvent::Gaussian { noise_multiplier: s } => {
                if !(s.is_finite() && *s > 0.0) {
                    return bad("noise_multiplier", format!("must be a finite number > 0, got {s}"));
                }
                Ok(())
            }
            DpEvent::Laplace { noise_multiplier: b } => {
                if !(b.is_finite() && *b > 0.0) {
                    return bad("noise_multiplier", format!("must be a finite number > 0, got {b}"));
                }
                Ok(())
            }
            DpEvent::EpsilonDelta { epsilon, delta } => {
                if !(epsilon.is_finite() && *epsilon >= 0.0) {
                    return bad("epsilon", format!("must be finite and ≥ 0, got {epsilon}"));
                }
                if !(*delta >= 0.0 && *delta <= 1.0) {
                    return bad("delta", format!("must be in [0, 1], got {delta}"));
                }
                Ok(())
            }
            DpEvent::PoissonSampled { q, event } => {
                if !(*q > 0.0 && *q <= 1.0) {
                    return bad("q", format!("sampling probability must be in (0, 1], got {q}"));
                }
                event.validate_at(&Path::Event(path))
            }
            DpEvent::SampledWithoutReplacement { n, m, event } => {
                if *n == 0 {
                    return bad("n", "dataset size must be ≥ 1".into());
                }
                if *m == 0 || m > n {
                    return bad("m", format!("sample size must be in 1..={n}, got {m}"));
                }
                event.validate_at(&Path::Event(path))
            }
            DpEvent::Composed { events } => {
                for (i, e) in events.iter().enumerate() {
                    e.validate_at(&Path::Events(path, i))?;
                }
                Ok(())
            }
            DpEvent::SelfComposed { event, .. } => event.validate_at(&Path::Event(path)),
        }
    }

    /// Flattens the tree into homogeneous components, merging equal ones. Nested sampling
    /// (a sampled event inside another sampling wrapper) and sampling around anything but a
    /// single mechanism are reported as unsupported with their path.
    pub fn components(&self) -> Result<Vec<Component>> {
        let mut acc = Collector::default();
        self.collect(&Path::Root, 1, &mut acc)?;
        Ok(acc.out)
    }

    /// Walks the tree once. Equal components are merged through a hash map keyed by their
    /// bit patterns, so collecting n parts costs O(n) rather than O(n²); the path of the node
    /// being visited is a chain of borrowed segments, formatted only into an error message.
    fn collect(&self, path: &Path<'_>, mult: u64, acc: &mut Collector) -> Result<()> {
        let leaf = |e: &DpEvent| -> Option<Mechanism> {
            match e {
                DpEvent::Gaussian { noise_multiplier } => Some(Mechanism::Gaussian {
                    noise_multiplier: *noise_multiplier,
                }),
                DpEvent::EpsilonDelta { epsilon, delta } => Some(Mechanism::EpsilonDelta {
                    epsilon: *epsilon,
                    delta: *delta,
                }),
                DpEvent::Laplace { noise_multiplier } => Some(Mechanism::Laplace {
                    noise_multiplier: *noise_multiplier,
                }),
                _ => None,
            }
        };
        let unsupported = |path: &Path<'_>, inner: &DpEvent| {
            Error::unsupported(format!(
                "{path}.event: sampling around `{}` is not supported (only around a single mechanism)",
                inner.type_name()
            ))
        };
        match self {
            DpEvent::NoOp => Ok(()),
            // No component can stand for it: accountants answer ε = ∞ before flattening
            // (`accountants::non_private_epsilon`); any other caller is refused here.
            DpEvent::NonPrivate => Err(Error::unsupported(format!(
                "{path}: a non-private event (no guarantee) has no finite privacy accounting: ε = ∞"
            ))),
            DpEvent::Gaussian { .. } | DpEvent::EpsilonDelta { .. } | DpEvent::Laplace { .. } => match leaf(self) {
                Some(m) => acc.push(Sampling::Full, m, mult, path),
                None => Ok(()),
            },
            DpEvent::PoissonSampled { q, event } => {
                let (inner, count) = unwrap_repeat(event).ok_or_else(|| overflow(path))?;
                let Some(m) = leaf(inner) else {
                    return Err(unsupported(path, inner));
                };
                let s = if *q >= 1.0 {
                    Sampling::Full
                } else {
                    Sampling::Poisson { q: *q }
                };
                acc.push(s, m, mult.checked_mul(count).ok_or_else(|| overflow(path))?, path)
            }
            DpEvent::SampledWithoutReplacement { n, m: size, event } => {
                let (inner, count) = unwrap_repeat(event).ok_or_else(|| overflow(path))?;
                let Some(m) = leaf(inner) else {
                    return Err(unsupported(path, inner));
                };
                acc.push(
                    Sampling::WithoutReplacement { n: *n, m: *size },
                    m,
                    mult.checked_mul(count).ok_or_else(|| overflow(path))?,
                    path,
                )
            }
            DpEvent::Composed { events } => {
                for (i, e) in events.iter().enumerate() {
                    e.collect(&Path::Events(path, i), mult, acc)?;
                }
                Ok(())
            }
            DpEvent::SelfComposed { event, count } => {
                let mult = mult.checked_mul(*count).ok_or_else(|| overflow(path))?;
                event.collect(&Path::Event(path), mult, acc)
            }
        }
    }

    /// The path (`event.events[1].event`) of the first [`DpEvent::NonPrivate`] in the tree, if
    /// any: such an event has no guarantee, whatever wraps it (Poisson sampling with q > 0 of a
    /// non-private mechanism is still non-private).
    pub(crate) fn non_private_path(&self) -> Option<String> {
        fn walk(e: &DpEvent, path: &mut String) -> bool {
            match e {
                DpEvent::NonPrivate => true,
                DpEvent::PoissonSampled { event, .. }
                | DpEvent::SampledWithoutReplacement { event, .. }
                | DpEvent::SelfComposed { event, .. } => {
                    let len = path.len();
                    path.push_str(".event");
                    if walk(event, path) {
                        return true;
                    }
                    path.truncate(len);
                    false
                }
                DpEvent::Composed { events } => {
                    for (i, ev) in events.iter().enumerate() {
                        let len = path.len();
                        path.push_str(&format!(".events[{i}]"));
                        if walk(ev, path) {
                            return true;
                        }
                        path.truncate(len);
                    }
                    false
                }
                DpEvent::NoOp | DpEvent::Gaussian { .. } | DpEvent::EpsilonDelta { .. } | DpEvent::Laplace { .. } => {
                    false
                }
            }
        }
        let mut path = "event".to_string();
        walk(self, &mut path).then_some(path)
    }

    /// Printable ledger: one line per node, indented, numbers with six significant digits
    /// (the event itself, in JSON or an event file, keeps full precision).
    pub fn ledger(&self) -> String {
        let mut s = String::new();
        self.write_ledger(0, &mut s);
        s
    }

    fn write_ledger(&self, depth: usize, s: &mut String) {
        use crate::numeric::format::sig6;
        let pad = "  ".repeat(depth);
        match self {
            DpEvent::NoOp => s.push_str(&format!("{pad}no-op\n")),
            DpEvent::NonPrivate => s.push_str(&format!("{pad}non-private (no guarantee)\n")),
            DpEvent::Gaussian { noise_multiplier } => s.push_str(&format!(
                "{pad}Gaussian(noise_multiplier = {}, μ = {})\n",
                sig6(*noise_multiplier),
                sig6(1.0 / noise_multiplier)
            )),
            DpEvent::EpsilonDelta { epsilon, delta } => {
                s.push_str(&format!("{pad}(ε = {}, δ = {})-DP\n", sig6(*epsilon), sig6(*delta)))
            }
            DpEvent::Laplace { noise_multiplier } => s.push_str(&format!(
                "{pad}Laplace(noise_multiplier = {}, scale/L1 sensitivity)\n",
                sig6(*noise_multiplier)
            )),
            DpEvent::PoissonSampled { q, event } => {
                s.push_str(&format!("{pad}Poisson sample (q = {}) of:\n", sig6(*q)));
                event.write_ledger(depth + 1, s);
            }
            DpEvent::SampledWithoutReplacement { n, m, event } => {
                s.push_str(&format!("{pad}sample {m} of {n} without replacement, then:\n"));
                event.write_ledger(depth + 1, s);
            }
            DpEvent::Composed { events } => {
                s.push_str(&format!("{pad}compose {} events:\n", events.len()));
                for e in events {
                    e.write_ledger(depth + 1, s);
                }
            }
            DpEvent::SelfComposed { event, count } => {
                s.push_str(&format!("{pad}repeat {count} times:\n"));
                event.write_ledger(depth + 1, s);
            }
        }
    }
}

/// The innermost non-repeat event and the product of the counts around it; `None` when the
/// product exceeds u64 (never saturated: 2⁶⁵ steps are not 2⁶⁴ − 1 steps).
fn unwrap_repeat(e: &DpEvent) -> Option<(&DpEvent, u64)> {
    match e {
        DpEvent::SelfComposed { event, count } => {
            let (inner, c) = unwrap_repeat(event)?;
            Some((inner, c.checked_mul(*count)?))
        }
        other => Some((other, 1)),
    }
}

/// The error for a composed count beyond u64 (counts are never saturated silently).
fn overflow(path: &Path<'_>) -> Error {
    Error::field(
        format!("{path}.count"),
        format!(
            "the number of times this sub-event runs exceeds {} (2^64 − 1), the largest count dpaudit accounts; it is refused rather than rounded down",
            u64::MAX
        ),
    )
}

/// The path of a node in the tree (`event.events[3].event`), built only when an error
/// names it.
enum Path<'a> {
    Root,
    Events(&'a Path<'a>, usize),
    Event(&'a Path<'a>),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("event"),
            Path::Events(p, i) => write!(f, "{p}.events[{i}]"),
            Path::Event(p) => write!(f, "{p}.event"),
        }
    }
}

/// Hash key of a component: the bit patterns of its parameters (NaN never reaches here:
/// events are validated first; adding 0.0 maps −0.0 to 0.0 so the two merge as before).
type ComponentKey = (u8, u64, u64, u8, [u64; 2]);

fn component_key(sampling: Sampling, mechanism: Mechanism) -> ComponentKey {
    let (sk, sa, sb) = match sampling {
        Sampling::Full => (0u8, 0u64, 0u64),
        Sampling::Poisson { q } => (1, (q + 0.0).to_bits(), 0),
        Sampling::WithoutReplacement { n, m } => (2, n, m),
    };
    let (mk, mp) = match mechanism {
        Mechanism::Gaussian { noise_multiplier } => (0u8, [(noise_multiplier + 0.0).to_bits(), 0]),
        Mechanism::EpsilonDelta { epsilon, delta } => (1, [(epsilon + 0.0).to_bits(), (delta + 0.0).to_bits()]),
        Mechanism::Laplace { noise_multiplier } => (2, [(noise_multiplier + 0.0).to_bits(), 0]),
    };
    (sk, sa, sb, mk, mp)
}

/// Components in first-seen order with a hash index for merging equal ones.
#[derive(Default)]
struct Collector {
    out: Vec<Component>,
    index: std::collections::HashMap<ComponentKey, usize>,
}

impl Collector {
    fn push(&mut self, sampling: Sampling, mechanism: Mechanism, count: u64, path: &Path<'_>) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        match self.index.entry(component_key(sampling, mechanism)) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let c = &mut self.out[*e.get()];
                c.count = c.count.checked_add(count).ok_or_else(|| overflow(path))?;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.out.len());
                self.out.push(Component {
                    sampling,
                    mechanism,
                    count,
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for DpEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.ledger())
    }
}

/// Accumulates events as they happen; consecutive repeats merge into `SelfComposed`.
#[derive(Debug, Default, Clone)]
pub struct EventBuilder {
    parts: Vec<(DpEvent, u64)>,
}

impl EventBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }
    /// Records one run of `event`.
    pub fn push(&mut self, event: DpEvent) -> &mut Self {
        self.push_n(event, 1)
    }
    /// Records `count` runs of `event` (merged with the previous entry when equal).
    pub fn push_n(&mut self, event: DpEvent, count: u64) -> &mut Self {
        if count == 0 || event == DpEvent::NoOp {
            return self;
        }
        // Counts never saturate: a product or sum beyond u64 keeps its own (nested) entry, and
        // flattening it ([`DpEvent::components`]) refuses it with the path of its count.
        let (event, count) = match event {
            DpEvent::SelfComposed { event, count: c } if c.checked_mul(count).is_some() => (*event, c * count),
            e => (e, count),
        };
        match self.parts.last_mut() {
            Some((last, n)) if *last == event && n.checked_add(count).is_some() => *n += count,
            _ => self.parts.push((event, count)),
        }
        self
    }
    /// Number of events pushed so far (counting repeats; saturates at 2⁶⁴ − 1, display only).
    pub fn len(&self) -> u64 {
        self.parts.iter().fold(0u64, |a, (_, n)| a.saturating_add(*n))
    }
    /// True when nothing private has been recorded.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
    /// The recorded events as one tree (`NoOp` when empty).
    pub fn build(&self) -> DpEvent {
        let mut evs: Vec<DpEvent> = self
            .parts
            .iter()
            .map(|(e, n)| {
                if *n == 1 {
                    e.clone()
                } else {
                    DpEvent::repeat(e.clone(), *n)
                }
            })
            .collect();
        match evs.len() {
            0 => DpEvent::NoOp,
            1 => evs.pop().unwrap(),
            _ => DpEvent::Composed { events: evs },
        }
    }
}

/// The event-file format read by `dpaudit account/calibrate/check`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventFile {
    /// Format version; must be 1.
    pub schema_version: u32,
    #[serde(default)]
    /// Neighbouring relation (default add/remove).
    pub neighbouring: Neighbouring,
    /// Optional δ (flags override).
    pub delta: Option<f64>,
    /// The event tree (`[event]`).
    pub event: DpEvent,
}

impl EventFile {
    /// The file as TOML text, readable by [`EventFile::load`] (floats are written in their
    /// shortest round-trip form, so a saved file loads back to the identical event).
    pub fn to_toml(&self, comment: &str) -> Result<String> {
        let body = toml::to_string(self).map_err(|e| Error::input(format!("cannot write the event file: {e}")))?;
        let mut s = String::new();
        for line in comment.lines() {
            s.push_str("# ");
            s.push_str(line);
            s.push('\n');
        }
        s.push_str(&body);
        Ok(s)
    }

    /// Reads and validates an event file; errors name the file, line and field.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let f: EventFile = crate::input::load_toml(path)?;
        if f.schema_version != 1 {
            return Err(Error::field(
                "schema_version",
                format!("unsupported schema_version {} (this dpaudit reads 1)", f.schema_version),
            )
            .with_file(path));
        }
        if let Some(d) = f.delta {
            if !(d > 0.0 && d < 1.0) {
                return Err(Error::field("delta", format!("{d} is not a δ: it must be in (0, 1)")).with_file(path));
            }
        }
        f.event.validate().map_err(|e| e.with_file(path))?;
        Ok(f)
    }
}

/// Path (as in [`DpEvent::validate`] errors: `event.events[1].event`) of the first sub-event for
/// which `bad` returns `Some(reason)`, with that reason. Accountants use it to name the sub-event
/// they cannot account.
pub(crate) fn find_path(
    event: &DpEvent,
    path: &str,
    bad: &dyn Fn(&DpEvent) -> Option<String>,
) -> Option<(String, String)> {
    if let Some(r) = bad(event) {
        return Some((path.to_string(), r));
    }
    match event {
        DpEvent::PoissonSampled { event, .. }
        | DpEvent::SampledWithoutReplacement { event, .. }
        | DpEvent::SelfComposed { event, .. } => find_path(event, &format!("{path}.event"), bad),
        DpEvent::Composed { events } => events
            .iter()
            .enumerate()
            .find_map(|(i, e)| find_path(e, &format!("{path}.events[{i}]"), bad)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_merges_repeats() {
        let mut b = EventBuilder::new();
        let step = DpEvent::poisson(0.01, DpEvent::gaussian(1.0));
        for _ in 0..5 {
            b.push(step.clone());
        }
        b.push(DpEvent::gaussian(2.0));
        b.push_n(step.clone(), 3);
        let ev = b.build();
        let comps = ev.components().unwrap();
        assert_eq!(comps.len(), 2);
        assert_eq!(comps[0].count, 8);
        assert_eq!(comps[1].count, 1);
        assert_eq!(b.len(), 9);
    }

    #[test]
    fn toml_round_trip_and_errors() {
        let src = r#"
schema_version = 1
neighbouring = "add_remove"
[event]
type = "self_composed"
count = 100
[event.event]
type = "poisson_sampled"
q = 0.01
[event.event.event]
type = "gaussian"
noise_multiplier = 1.1
"#;
        let f: EventFile = toml::from_str(src).unwrap();
        assert_eq!(f.event, DpEvent::dpsgd(1.1, 0.01, 100));
        let bad = src.replace("q = 0.01", "q = 1.5");
        let f: EventFile = toml::from_str(&bad).unwrap();
        let e = f.event.validate().unwrap_err();
        assert_eq!(e.field.as_deref(), Some("event.event.q"));
        // Opacus' and dp_accounting's names of the sampling probability read as `q`.
        for name in ["sample_rate", "sampling_probability"] {
            let f: EventFile = toml::from_str(&src.replace("q = 0.01", &format!("{name} = 0.01"))).unwrap();
            assert_eq!(f.event, DpEvent::dpsgd(1.1, 0.01, 100), "{name}");
        }
        let twice = src.replace("q = 0.01", "q = 0.01\nsample_rate = 0.02");
        assert!(toml::from_str::<EventFile>(&twice).is_err(), "two names of one field");
    }

    #[test]
    fn saved_files_load_back_identically() {
        let ev = DpEvent::Composed {
            events: vec![
                DpEvent::dpsgd(0.8, 64.0 / 60000.0, 9375),
                DpEvent::gdp(0.1 + 0.2),
                DpEvent::SampledWithoutReplacement {
                    n: 10,
                    m: 3,
                    event: Box::new(DpEvent::gaussian(2.0)),
                },
                DpEvent::EpsilonDelta {
                    epsilon: 1.0 / 3.0,
                    delta: 1e-7,
                },
            ],
        };
        let f = EventFile {
            schema_version: 1,
            neighbouring: Neighbouring::ReplaceOne,
            delta: Some(1e-5),
            event: ev.clone(),
        };
        let text = f.to_toml("written by a test\nsecond line").unwrap();
        assert!(text.starts_with("# written by a test\n# second line\n"));
        let back: EventFile = toml::from_str(&text).unwrap();
        assert_eq!(back.event, ev);
        assert_eq!((back.neighbouring, back.delta), (Neighbouring::ReplaceOne, Some(1e-5)));
    }

    #[test]
    fn sampling_around_composition_is_named() {
        let ev = DpEvent::Composed {
            events: vec![
                DpEvent::gaussian(1.0),
                DpEvent::poisson(0.1, DpEvent::Composed { events: vec![] }),
            ],
        };
        let e = ev.components().unwrap_err();
        assert!(e.message.contains("event.events[1].event"), "{}", e.message);
    }
}
