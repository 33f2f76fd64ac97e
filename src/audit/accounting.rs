//! Running the accountants on an event and filling a [`Report`] with what they answer: results
//! of several accountants, the components table, the per-step trajectory (when the event is a
//! sequence of full-batch Gaussian steps), ε-versus-δ and trade-off plots. Used by `account`
//! and `check` (the budget verdict is decided in [`super::check`]); `report/` only models and
//! exports what this computes.

use crate::accountants::{gdp, Accountant, AccountantKind, BoundKind, Evidence};
use crate::error::Result;
use crate::events::{Component, DpEvent, Mechanism, Neighbouring, Sampling};
use crate::report::plot::{self, Series};
use crate::report::{Cell, Column, Report, Skipped, Table};

/// δ values at which ε(δ) is evaluated for the ε-versus-δ and trade-off plots.
pub const DELTA_GRID: [f64; 12] = [0.5, 0.2, 0.1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10];

/// The sampling assumption of an event that holds a non-private part (no sampling amplifies it).
const NON_PRIVATE_SAMPLING: &str = "irrelevant: the event holds a non-private part (no guarantee)";

/// Longest step sequence drawn as a per-step trajectory.
pub const MAX_TRAJECTORY_STEPS: usize = 100_000;

/// What to compute besides the headline ε.
#[derive(Debug, Clone, Copy)]
pub struct AccountOptions {
    /// Tables and plots (ε versus δ, trade-off curves, per-step trajectory).
    pub curves: bool,
}

/// Runs each accountant on `event` at `delta` and records results (or why an accountant was
/// skipped), the event, the assumptions and, with `opts.curves`, tables and plots. `tick` is
/// called after each unit of work (for progress bars).
pub(crate) fn account_event(
    report: &mut Report,
    event: &DpEvent,
    neighbouring: Neighbouring,
    delta: f64,
    kinds: &[AccountantKind],
    opts: AccountOptions,
    tick: &mut dyn FnMut(&str),
) -> Result<()> {
    crate::accountants::check_delta(delta)?;
    event.validate()?;
    report.event = Some(event.clone());
    report.delta = Some(delta);
    report.assumptions.neighbouring = Some(neighbouring);
    // An event no accountant can flatten is still reported: each accountant says why it skips it.
    let comps = event.components().ok();
    report.assumptions.sampling = Some(match &comps {
        Some(c) => describe_sampling(c),
        None if event.non_private_path().is_some() => NON_PRIVATE_SAMPLING.into(),
        None => "not a supported shape (see the skipped accountants)".into(),
    });

    let mut accountants: Vec<Box<dyn Accountant>> = Vec::new();
    // ε at every δ of the plots, from the same composition as the headline ε.
    let mut curves: Vec<Vec<Result<Evidence>>> = Vec::new();
    for &k in kinds {
        let acc = k.build();
        tick(k.as_str());
        let mut curve = Vec::new();
        match acc.supports(event, neighbouring).and_then(|_| {
            if !opts.curves {
                return acc.epsilon(event, neighbouring, delta);
            }
            let (head, grid) = acc.epsilon_profile(event, neighbouring, delta, &DELTA_GRID);
            curve = grid;
            head
        }) {
            Ok(r) => {
                report.results.push(r);
                accountants.push(acc);
                curves.push(curve);
            }
            Err(e) => report.skipped.push(Skipped {
                accountant: k,
                reason: crate::accountants::plain_reason(k, &e.to_string()),
            }),
        }
    }
    if let Some(clt) = report.results.iter().find(|r| r.kind == BoundKind::Estimate) {
        report.warn(
            "estimate_not_a_bound",
            format!(
                "the {} result (ε = {}) is an estimate, not a guarantee; budgets are checked against sound bounds only",
                clt.source(),
                crate::report::export::fmt_num(clt.epsilon)
            ),
            false,
        );
    }
    if !opts.curves {
        return Ok(());
    }
    if let Some(c) = &comps {
        report.tables.push(components_table(c));
    }
    if let Some(steps) = trajectory(event) {
        add_trajectory(report, &steps, delta)?;
    }
    add_profile_plots(report, &accountants, curves, tick);
    Ok(())
}

/// Runs each accountant for δ at `epsilon` (the `--epsilon` question) and records results,
/// skipped accountants, the event and the assumptions. [`Report::delta`] stays empty: each
/// result carries its own δ.
pub(crate) fn account_delta(
    report: &mut Report,
    event: &DpEvent,
    neighbouring: Neighbouring,
    epsilon: f64,
    kinds: &[AccountantKind],
    tick: &mut dyn FnMut(&str),
) -> Result<()> {
    crate::accountants::check_epsilon(epsilon)?;
    event.validate()?;
    report.event = Some(event.clone());
    report.assumptions.neighbouring = Some(neighbouring);
    report.assumptions.sampling = Some(match event.components() {
        Ok(c) => describe_sampling(&c),
        Err(_) if event.non_private_path().is_some() => NON_PRIVATE_SAMPLING.into(),
        Err(_) => "not a supported shape (see the skipped accountants)".into(),
    });
    for &k in kinds {
        let acc = k.build();
        tick(k.as_str());
        match acc
            .supports(event, neighbouring)
            .and_then(|_| acc.delta(event, neighbouring, epsilon))
        {
            Ok(r) => report.results.push(r),
            Err(e) => report.skipped.push(Skipped {
                accountant: k,
                reason: crate::accountants::plain_reason(k, &e.to_string()),
            }),
        }
    }
    report.fact("question", format!("δ at ε = {}", crate::report::num::fmt(epsilon)));
    Ok(())
}

/// One line describing how the components are sampled.
pub(crate) fn describe_sampling(comps: &[Component]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in comps {
        let s = match c.sampling {
            Sampling::Full => "full batch".to_string(),
            Sampling::Poisson { q } => format!("Poisson, q = {}", crate::numeric::format::fmt_num(q)),
            Sampling::WithoutReplacement { n, m } => format!("without replacement, {m} of {n}"),
        };
        if !parts.contains(&s) {
            parts.push(s);
        }
    }
    if parts.is_empty() {
        "none (no private steps)".into()
    } else {
        parts.join("; ")
    }
}

/// The flattened components as a table.
pub(crate) fn components_table(comps: &[Component]) -> Table {
    let rows = comps
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (sampling, q): (&str, Option<f64>) = match c.sampling {
                Sampling::Full => ("full", None),
                Sampling::Poisson { q } => ("poisson", Some(q)),
                Sampling::WithoutReplacement { n, m } => ("without_replacement", Some(m as f64 / n as f64)),
            };
            let (mech, sigma, mu, eps, del) = match c.mechanism {
                Mechanism::Gaussian { noise_multiplier } => (
                    "gaussian",
                    Some(noise_multiplier),
                    Some(1.0 / noise_multiplier),
                    None,
                    None,
                ),
                Mechanism::EpsilonDelta { epsilon, delta } => ("epsilon_delta", None, None, Some(epsilon), Some(delta)),
                Mechanism::Laplace { noise_multiplier } => ("laplace", Some(noise_multiplier), None, None, None),
            };
            vec![
                Cell::from(i),
                Cell::from(sampling),
                Cell::from(q),
                Cell::from(mech),
                Cell::from(sigma),
                Cell::from(mu),
                Cell::from(eps),
                Cell::from(del),
                Cell::from(c.count),
            ]
        })
        .collect();
    Table {
        id: "components".into(),
        title: "Components (homogeneous parts of the event)".into(),
        columns: vec![
            Column::new("component"),
            Column::new("sampling"),
            Column::with_unit("rate", "fraction"),
            Column::new("mechanism"),
            Column::with_unit("noise_multiplier", "× sensitivity"),
            Column::with_unit("mu", "GDP μ per step"),
            Column::with_unit("epsilon", "nats"),
            Column::new("delta"),
            Column::new("count"),
        ],
        rows,
        note: Some("μ is the per-step Gaussian-DP parameter before any subsampling (1 / noise multiplier).".into()),
    }
}

/// The event as an ordered list of per-step μ, when it is a sequence of full-batch Gaussian
/// steps (as a diffusion sampler run by the private denoiser), at most
/// [`MAX_TRAJECTORY_STEPS`] long.
pub fn trajectory(event: &DpEvent) -> Option<Vec<f64>> {
    fn walk(e: &DpEvent, out: &mut Vec<f64>) -> bool {
        match e {
            DpEvent::NoOp => true,
            DpEvent::Gaussian { noise_multiplier } => {
                out.push(1.0 / noise_multiplier);
                out.len() <= MAX_TRAJECTORY_STEPS
            }
            DpEvent::Composed { events } => events.iter().all(|x| walk(x, out)),
            DpEvent::SelfComposed { event, count } => {
                if (*count as usize).saturating_add(out.len()) > MAX_TRAJECTORY_STEPS {
                    return false;
                }
                (0..*count).all(|_| walk(event, out))
            }
            _ => false,
        }
    }
    let mut out = Vec::new();
    (walk(event, &mut out) && out.len() >= 2).then_some(out)
}

/// Adds the per-step table and the per-step/cumulative plots for a full-batch trajectory:
/// cumulative μ = sqrt(Σ μ_i²) (Dong, Roth & Su 2022, Cor. 3.3) and the exact ε at `delta`.
pub(crate) fn add_trajectory(report: &mut Report, mu: &[f64], delta: f64) -> Result<()> {
    let mut cum_mu = Vec::with_capacity(mu.len());
    let mut cum_eps = Vec::with_capacity(mu.len());
    let mut sum_sq = 0.0f64;
    for &m in mu {
        sum_sq += m * m;
        let c = sum_sq.sqrt();
        cum_mu.push(c);
        cum_eps.push(gdp::epsilon_for_delta(c, delta)?);
    }
    // Steps are numbered from 0, as in `analyze`'s tables, in both the table and the plots.
    let steps: Vec<f64> = (0..mu.len()).map(|i| i as f64).collect();
    report.tables.push(Table {
        id: "steps".into(),
        title: "Per-step privacy along the trajectory".into(),
        columns: vec![
            Column::new("step"),
            Column::with_unit("mu_t", "GDP μ"),
            Column::with_unit("cumulative_mu", "GDP μ"),
            Column::with_unit("cumulative_epsilon", "nats"),
        ],
        rows: (0..mu.len())
            .map(|i| {
                vec![
                    Cell::from(i),
                    Cell::Num(mu[i]),
                    Cell::Num(cum_mu[i]),
                    Cell::Num(cum_eps[i]),
                ]
            })
            .collect(),
        note: Some(format!(
            "Cumulative ε is the exact GDP ε at δ = {} of the steps so far.",
            crate::report::export::fmt_num(delta)
        )),
    });
    report
        .plots
        .push(plot::per_step_mu(&steps, mu, "step (order of execution)", ""));
    report.plots.push(plot::cumulative(
        &steps,
        vec![
            Series::new("cumulative μ (GDP)", vec![], cum_mu),
            Series::new(
                format!("cumulative ε at δ = {} (exact)", crate::report::export::fmt_num(delta)),
                vec![],
                cum_eps,
            ),
        ],
        "μ / ε",
        "GDP μ / nats",
        "step (order of execution)",
    ));
    Ok(())
}

/// ε versus δ for each accountant that produced a result, and the trade-off curves: exact G_μ
/// for GDP, G_μ of the CLT's μ (dashed, estimate), and the curve implied by the (ε, δ) profile
/// for the others (a sound lower bound on their trade-off function).
/// `curves[i]` holds accountant i's ε at each δ of [`DELTA_GRID`].
fn add_profile_plots(
    report: &mut Report,
    accountants: &[Box<dyn Accountant>],
    curves: Vec<Vec<Result<Evidence>>>,
    tick: &mut dyn FnMut(&str),
) {
    let mut eps_series = Vec::new();
    let mut trade_series = Vec::new();
    for (acc, curve) in accountants.iter().zip(curves) {
        tick(&format!("{} ε(δ)", acc.kind().as_str()));
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut kind = None;
        for (&d, r) in DELTA_GRID.iter().zip(curve) {
            // ε below 1e-12 is 0 to the eye and would stretch the log axis over hundreds of
            // decades (an accountant may return the smallest positive float for ε = 0).
            if let Some(r) = r.ok().filter(|r| r.epsilon.is_finite() && r.epsilon >= 1e-12) {
                kind = Some(r.kind);
                xs.push(d);
                ys.push(r.epsilon);
            }
        }
        let Some(kind) = kind else { continue };
        let headline: Option<&Evidence> = report.results.iter().find(|r| r.is_from(acc.kind()));
        let mu = headline.and_then(|r| r.details.get("mu").copied());
        let name = format!("{} ({})", acc.kind().as_str(), kind.describe());
        match (acc.kind(), mu) {
            (AccountantKind::Gdp | AccountantKind::Clt, Some(mu)) if mu.is_finite() => {
                trade_series.push(plot::gdp_tradeoff_series(
                    &format!("{name}, μ = {}", crate::report::export::fmt_num(mu)),
                    mu,
                    kind,
                ));
            }
            _ => {
                let alpha = plot::alpha_grid(200);
                let beta = plot::profile_tradeoff(&ys, &xs, &alpha);
                let mut s = Series::for_accountant(acc.kind(), kind, alpha, beta);
                s.name = format!("{name}, from ε(δ)");
                trade_series.push(s);
            }
        }
        eps_series.push(Series::for_accountant(acc.kind(), kind, xs, ys).with_markers());
    }
    // The headline results, at the δ in use, as markers on their curves.
    if let Some(d) = report.delta {
        let (xs, ys): (Vec<f64>, Vec<f64>) = report
            .results
            .iter()
            .filter(|r| r.epsilon.is_finite() && r.epsilon >= 1e-12)
            .map(|r| (d, r.epsilon))
            .unzip();
        if !xs.is_empty() && !eps_series.is_empty() {
            eps_series.push(
                Series::new(
                    format!("results at the δ in use, {}", crate::report::export::fmt_num(d)),
                    xs,
                    ys,
                )
                .with_style(plot::LineStyle::Points)
                .with_marker(plot::Marker::Diamond)
                .with_colour((0, 0, 0)),
            );
        }
    }
    if !eps_series.is_empty() {
        report.plots.push(plot::epsilon_vs_delta(eps_series));
        report.plots.push(plot::tradeoff(trade_series));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trajectory_of_full_batch_sequence() {
        let ev = DpEvent::Composed {
            events: vec![DpEvent::gdp(0.5), DpEvent::repeat(DpEvent::gdp(0.25), 3)],
        };
        assert_eq!(trajectory(&ev).unwrap(), vec![0.5, 0.25, 0.25, 0.25]);
        assert!(trajectory(&DpEvent::dpsgd(1.0, 0.01, 10)).is_none());
    }
}
