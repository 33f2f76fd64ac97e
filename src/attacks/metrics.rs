//! Attack metrics from the **exact** ROC over all scores (higher score = "member").
//!
//! * [`roc`]: every distinct threshold, from (0, 0) to (1, 1); ties move together.
//! * [`auc`]: trapezoidal area of the exact ROC (= Mann–Whitney U/(n₊n₋), ties counted ½).
//! * [`tpr_at_fpr`]: the largest TPR among ROC points with FPR ≤ target.
//! * [`oracle_asr`]: max over thresholds of the balanced accuracy (TPR + 1 − FPR)/2 — optimistic,
//!   the threshold sees the labels it is scored on.
//! * [`heldout_asr`]: the threshold chosen on a calibration half, accuracy on the other half.
//! * [`bootstrap`]: stratified percentile intervals (seeded).
//! * [`epsilon_lower`]: an empirical ε lower bound from Clopper–Pearson bounds on a held-out test
//!   half (Jagielski et al. 2020; Kairouz et al. 2015 Thm 2.1), through [`super::audit`].
//!
//! ASR is the balanced accuracy: the success rate of the attacker under a uniform prior on
//! member / non-member, which is what the theoretical limits bound.

use rand::seq::SliceRandom;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// An exact ROC curve: points (fpr[i], tpr[i]) for "member iff score ≥ thresholds[i]".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roc {
    /// False-positive rates, nondecreasing.
    pub fpr: Vec<f64>,
    /// True-positive rates, one per FPR.
    pub tpr: Vec<f64>,
    /// Score thresholds giving each point.
    pub thresholds: Vec<f64>,
}

fn check(pos: &[f64], neg: &[f64]) -> Result<()> {
    if pos.is_empty() || neg.is_empty() {
        return Err(Error::input("ROC needs at least one member and one non-member score"));
    }
    if pos.iter().chain(neg).any(|s| s.is_nan()) {
        return Err(Error::numeric("an attack score is NaN"));
    }
    Ok(())
}

/// The exact ROC of `pos` (members) against `neg` (non-members).
///
/// Each side is sorted on its own (descending, total order) and the two are merged, grouping
/// equal scores: the same curve as sorting all scores together, without a labelled copy. Sorted
/// input (the bootstrap's resamples, [`bootstrap`]) costs one pass.
pub fn roc(pos: &[f64], neg: &[f64]) -> Result<Roc> {
    check(pos, neg)?;
    let (p, n) = (sorted_desc(pos), sorted_desc(neg));
    let (np, nn) = (p.len() as f64, n.len() as f64);
    let points = p.len() + n.len() + 1;
    let mut r = Roc {
        fpr: Vec::with_capacity(points),
        tpr: Vec::with_capacity(points),
        thresholds: Vec::with_capacity(points),
    };
    r.fpr.push(0.0);
    r.tpr.push(0.0);
    r.thresholds.push(f64::INFINITY);
    let (mut tp, mut fp) = (0usize, 0usize);
    while tp < p.len() || fp < n.len() {
        // The next threshold: the larger head (total order); every score equal to it moves.
        let s = match (p.get(tp), n.get(fp)) {
            (Some(&a), Some(&b)) => {
                if a.total_cmp(&b).is_ge() {
                    a
                } else {
                    b
                }
            }
            (Some(&a), None) => a,
            (None, Some(&b)) => b,
            (None, None) => unreachable!("loop condition"),
        };
        while tp < p.len() && p[tp] == s {
            tp += 1;
        }
        while fp < n.len() && n[fp] == s {
            fp += 1;
        }
        r.fpr.push(fp as f64 / nn);
        r.tpr.push(tp as f64 / np);
        r.thresholds.push(s);
    }
    Ok(r)
}

/// `v` sorted descending in the total order (borrowed when it already is).
fn sorted_desc(v: &[f64]) -> std::borrow::Cow<'_, [f64]> {
    if v.is_sorted_by(|a, b| b.total_cmp(a).is_le()) {
        std::borrow::Cow::Borrowed(v)
    } else {
        let mut v = v.to_vec();
        v.sort_by(|a, b| b.total_cmp(a));
        std::borrow::Cow::Owned(v)
    }
}

/// Area under the exact ROC (trapezoids; equals the Mann–Whitney statistic with ties ½).
pub fn auc(r: &Roc) -> f64 {
    r.fpr
        .windows(2)
        .zip(r.tpr.windows(2))
        .map(|(f, t)| (f[1] - f[0]) * (t[1] + t[0]) / 2.0)
        .sum()
}

/// Largest TPR among ROC points with FPR ≤ `target`.
pub fn tpr_at_fpr(r: &Roc, target: f64) -> f64 {
    r.fpr
        .iter()
        .zip(&r.tpr)
        .filter(|(f, _)| **f <= target + 1e-15)
        .map(|(_, t)| *t)
        .fold(0.0, f64::max)
}

/// Best balanced accuracy over all thresholds (the threshold is chosen on the scored data).
pub fn oracle_asr(r: &Roc) -> f64 {
    r.fpr
        .iter()
        .zip(&r.tpr)
        .map(|(f, t)| (t + 1.0 - f) / 2.0)
        .fold(0.5, f64::max)
}

/// The threshold of the best balanced accuracy on (`pos`, `neg`).
pub fn best_threshold(pos: &[f64], neg: &[f64]) -> Result<f64> {
    let r = roc(pos, neg)?;
    let mut best = (f64::NEG_INFINITY, f64::INFINITY);
    for ((f, t), th) in r.fpr.iter().zip(&r.tpr).zip(&r.thresholds) {
        let a = (t + 1.0 - f) / 2.0;
        if a > best.0 {
            best = (a, *th);
        }
    }
    Ok(best.1)
}

/// Balanced accuracy of "member iff score ≥ threshold".
pub fn asr_at(pos: &[f64], neg: &[f64], threshold: f64) -> f64 {
    let tpr = pos.iter().filter(|&&s| s >= threshold).count() as f64 / pos.len() as f64;
    let tnr = neg.iter().filter(|&&s| s < threshold).count() as f64 / neg.len() as f64;
    (tpr + tnr) / 2.0
}

/// A seeded split of indices 0..n into (calibration, test) halves.
pub fn halves(n: usize, rng: &mut ChaCha8Rng) -> (Vec<usize>, Vec<usize>) {
    let mut ix: Vec<usize> = (0..n).collect();
    ix.shuffle(rng);
    let test = ix.split_off(n / 2);
    (ix, test)
}

fn pick(v: &[f64], ix: &[usize]) -> Vec<f64> {
    ix.iter().map(|&i| v[i]).collect()
}

/// Scores split into a calibration half (chooses thresholds) and a test half (measures).
#[derive(Debug, Clone)]
pub struct HeldOut {
    /// Calibration-half member scores.
    pub cal_pos: Vec<f64>,
    /// Calibration-half non-member scores.
    pub cal_neg: Vec<f64>,
    /// Test-half member scores.
    pub test_pos: Vec<f64>,
    /// Test-half non-member scores.
    pub test_neg: Vec<f64>,
}

impl HeldOut {
    /// Splits members and non-members into halves each, seeded; needs at least 2 of each.
    pub fn split(pos: &[f64], neg: &[f64], seed: u64) -> Result<Self> {
        if pos.len() < 2 || neg.len() < 2 {
            return Err(Error::input(
                "held-out metrics need at least 2 members and 2 non-members",
            ));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0004_e1d0_u64);
        let (cp, tp) = halves(pos.len(), &mut rng);
        let (cn, tn) = halves(neg.len(), &mut rng);
        Ok(HeldOut {
            cal_pos: pick(pos, &cp),
            cal_neg: pick(neg, &cn),
            test_pos: pick(pos, &tp),
            test_neg: pick(neg, &tn),
        })
    }
}

/// ASR on the test half with the threshold chosen on the calibration half; returns (ASR, threshold).
pub fn heldout_asr(h: &HeldOut) -> Result<(f64, f64)> {
    let th = best_threshold(&h.cal_pos, &h.cal_neg)?;
    Ok((asr_at(&h.test_pos, &h.test_neg, th), th))
}

/// A percentile interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower end.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
    /// Confidence level, e.g. 0.95.
    pub level: f64,
}

/// Stratified bootstrap of `stat(pos, neg)`: members and non-members are resampled with
/// replacement separately, `reps` times; the (1−level)/2 and (1+level)/2 percentiles.
/// The resamples are drawn in order from one seeded stream and their statistics computed in
/// parallel, so the interval does not depend on the number of threads. Each resample reaches
/// `stat` sorted (descending), so `stat` must depend only on the multisets of scores (the ROC
/// statistics and [`asr_at`] do); the ROC of sorted input needs no sort.
pub fn bootstrap<F>(pos: &[f64], neg: &[f64], reps: usize, level: f64, seed: u64, stat: F) -> Result<Interval>
where
    F: Fn(&[f64], &[f64]) -> Result<f64> + Sync,
{
    if reps < 10 {
        return Err(Error::field("--bootstrap", "need at least 10 resamples"));
    }
    // Each resample keeps one statistic and costs a pass over every score.
    let per_rep = (pos.len() + neg.len()) as f64;
    crate::limits::check(
        "--bootstrap",
        reps as f64,
        crate::limits::Cost::new(8.0, crate::limits::BOOTSTRAP_SCORE.work * per_rep.max(1.0)),
    )?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb007_57a9);
    let (sp, sn) = (Ranked::new(pos)?, Ranked::new(neg)?);
    let mut vals = Vec::with_capacity(reps);
    // Chunks of resamples: drawn in order from the one stream while the chunk before is
    // evaluated in parallel.
    const CHUNK: usize = 32;
    let mut draw = |m: usize| -> Vec<(Vec<usize>, Vec<usize>)> {
        (0..m).map(|_| (sp.draw(&mut rng), sn.draw(&mut rng))).collect()
    };
    let mut next = draw(CHUNK.min(reps));
    let mut drawn = next.len();
    while !next.is_empty() {
        let cur = std::mem::take(&mut next);
        let m = CHUNK.min(reps - drawn);
        let (got, more) = rayon::join(
            || {
                cur.par_iter()
                    .map(|(dp, dn)| stat(&sp.resample(dp), &sn.resample(dn)))
                    .collect::<Vec<Result<f64>>>()
            },
            || draw(m),
        );
        drawn += more.len();
        next = more;
        for v in got {
            vals.push(v?);
        }
    }
    vals.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let i = ((p * (reps - 1) as f64).round() as usize).min(reps - 1);
        vals[i]
    };
    Ok(Interval {
        lo: q((1.0 - level) / 2.0),
        hi: q((1.0 + level) / 2.0),
        level,
    })
}

/// Scores sorted (descending, total order) with each original index's place among them: a
/// resample drawn as original indices comes out sorted by counting.
struct Ranked {
    sorted: Vec<f64>,
    place: Vec<usize>,
}

impl Ranked {
    /// Counts are u32 (half the cache of usize): at most `u32::MAX` scores a side.
    fn new(v: &[f64]) -> Result<Self> {
        if u32::try_from(v.len()).is_err() {
            return Err(Error::input(format!(
                "bootstrap: {} scores on one side, above {}",
                v.len(),
                u32::MAX
            )));
        }
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
        let mut place = vec![0; v.len()];
        for (k, &i) in order.iter().enumerate() {
            place[i] = k;
        }
        Ok(Ranked {
            sorted: order.iter().map(|&i| v[i]).collect(),
            place,
        })
    }

    /// `len` draws with replacement: original indices, in the order `rng` gives them (the
    /// stream's only sequential part).
    fn draw(&self, rng: &mut ChaCha8Rng) -> Vec<usize> {
        let n = self.sorted.len();
        (0..n).map(|_| rng.random_range(0..n)).collect()
    }

    /// The scores drawn as `draws` (original indices), sorted by counting.
    fn resample(&self, draws: &[usize]) -> Vec<f64> {
        let mut count = vec![0u32; self.sorted.len()];
        for &i in draws {
            count[self.place[i]] += 1;
        }
        let mut out = Vec::with_capacity(draws.len());
        for (&s, &c) in self.sorted.iter().zip(&count) {
            out.extend(std::iter::repeat_n(s, c as usize));
        }
        out
    }
}

pub use super::audit::{cp_upper, epsilon_from_rates};

/// Empirical ε lower bound of a membership attack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpsLower {
    /// The ε lower bound (0 when the attack proves nothing).
    pub epsilon_lower: f64,
    /// δ at which it holds.
    pub delta: f64,
    /// Probability with which it holds.
    pub confidence: f64,
    /// The score threshold chosen on the calibration half.
    pub threshold: f64,
    /// Test non-members scored as members at that threshold.
    pub false_positives: u64,
    /// Test members scored as non-members at that threshold.
    pub false_negatives: u64,
    /// Number of test non-members.
    pub test_nonmembers: u64,
    /// Number of test members.
    pub test_members: u64,
}

/// ε lower bound at confidence 1 − α through [`super::audit::audit_scores`]: the threshold
/// maximises the Clopper–Pearson-bounded ε on the calibration half; FPR and FNR on the test half
/// are replaced by one-sided CP upper bounds at α/2 each (Bonferroni).
pub fn epsilon_lower(h: &HeldOut, delta: f64, alpha: f64) -> Result<EpsLower> {
    let scores = super::audit::AuditScores {
        heldout_out: h.cal_neg.clone(),
        heldout_in: h.cal_pos.clone(),
        test_out: h.test_neg.clone(),
        test_in: h.test_pos.clone(),
    };
    let o = super::audit::audit_scores(&scores, delta, alpha)?;
    Ok(EpsLower {
        epsilon_lower: o.epsilon_lower,
        delta: o.delta,
        confidence: o.confidence,
        threshold: o.threshold,
        false_positives: o.false_positives,
        false_negatives: o.false_negatives,
        test_nonmembers: o.test_out,
        test_members: o.test_in,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed case: pos = {0.9, 0.8, 0.4}, neg = {0.7, 0.3}.
    /// Thresholds 0.9, 0.8, 0.7, 0.4, 0.3 give (FPR, TPR) = (0, 1/3), (0, 2/3), (1/2, 2/3),
    /// (1/2, 1), (1, 1). Pairs won: 0.9 beats both, 0.8 both, 0.4 beats 0.3 only → U = 5 of 6.
    #[test]
    fn roc_hand_computed() {
        let r = roc(&[0.9, 0.8, 0.4], &[0.7, 0.3]).unwrap();
        assert_eq!(r.fpr, vec![0.0, 0.0, 0.0, 0.5, 0.5, 1.0]);
        let third = 1.0 / 3.0;
        let want_tpr = [0.0, third, 2.0 * third, 2.0 * third, 1.0, 1.0];
        for (a, b) in r.tpr.iter().zip(want_tpr) {
            assert!((a - b).abs() < 1e-15);
        }
        assert!((auc(&r) - 5.0 / 6.0).abs() < 1e-15);
        // Largest FPR ≤ target: at 1% only FPR = 0 qualifies → TPR 2/3.
        assert!((tpr_at_fpr(&r, 0.01) - 2.0 / 3.0).abs() < 1e-15);
        assert!((tpr_at_fpr(&r, 0.5) - 1.0).abs() < 1e-15);
        // Best balanced accuracy: (2/3 + 1)/2 = 5/6 at FPR 0, or (1 + 1/2)/2 = 3/4.
        assert!((oracle_asr(&r) - 5.0 / 6.0).abs() < 1e-15);
        assert_eq!(best_threshold(&[0.9, 0.8, 0.4], &[0.7, 0.3]).unwrap(), 0.8);
    }

    #[test]
    fn ties_count_half_and_move_together() {
        // All scores equal: one jump from (0,0) to (1,1); AUC 1/2; ASR 1/2.
        let r = roc(&[1.0, 1.0], &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(r.fpr, vec![0.0, 1.0]);
        assert_eq!(r.tpr, vec![0.0, 1.0]);
        assert_eq!(auc(&r), 0.5);
        assert_eq!(oracle_asr(&r), 0.5);
        // pos {2, 1}, neg {1, 0}: U = 1 (2>1) + 1 (2>0) + ½ (1=1) + 1 (1>0) = 3.5 of 4.
        let r = roc(&[2.0, 1.0], &[1.0, 0.0]).unwrap();
        assert!((auc(&r) - 3.5 / 4.0).abs() < 1e-15);
    }

    #[test]
    fn perfect_and_inverted() {
        let r = roc(&[3.0, 4.0], &[1.0, 2.0]).unwrap();
        assert_eq!(auc(&r), 1.0);
        assert_eq!(oracle_asr(&r), 1.0);
        assert_eq!(tpr_at_fpr(&r, 0.0), 1.0);
        let r = roc(&[1.0, 2.0], &[3.0, 4.0]).unwrap();
        assert_eq!(auc(&r), 0.0);
        assert_eq!(oracle_asr(&r), 0.5);
    }

    /// scipy 1.x `beta.ppf(0.95, 3, 8)` = 0.5069013010632024 (k = 2, n = 10, α = 0.05); and
    /// beta.ppf(0.975, 1, 20) = 1 − 0.025^(1/20) = 0.16843 for k = 0, n = 20.
    #[test]
    fn clopper_pearson_values() {
        assert!(
            (cp_upper(2, 10, 0.05) - 0.506_901_301_063_202_4).abs() < 1e-12,
            "{}",
            cp_upper(2, 10, 0.05)
        );
        let want = 1.0 - 0.025f64.powf(1.0 / 20.0);
        assert!((cp_upper(0, 20, 0.025) - want).abs() < 1e-12);
        assert_eq!(cp_upper(5, 5, 0.05), 1.0);
    }

    #[test]
    fn epsilon_from_rates_cases() {
        // FPR = FNR = 1/2: no evidence.
        assert_eq!(epsilon_from_rates(0.5, 0.5, 0.0), 0.0);
        // FPR 0.1, FNR 0.3, δ 0: ln(0.9/0.3) = ln 3 vs ln(0.7/0.1) = ln 7.
        assert!((epsilon_from_rates(0.1, 0.3, 0.0) - 7f64.ln()).abs() < 1e-15);
    }

    /// The ROC as first written: all scores labelled, sorted together, equal scores grouped.
    fn roc_reference(pos: &[f64], neg: &[f64]) -> Roc {
        let mut all: Vec<(f64, bool)> = pos
            .iter()
            .map(|&s| (s, true))
            .chain(neg.iter().map(|&s| (s, false)))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0));
        let (np, nn) = (pos.len() as f64, neg.len() as f64);
        let mut r = Roc {
            fpr: vec![0.0],
            tpr: vec![0.0],
            thresholds: vec![f64::INFINITY],
        };
        let (mut tp, mut fp) = (0usize, 0usize);
        let mut i = 0;
        while i < all.len() {
            let s = all[i].0;
            while i < all.len() && all[i].0 == s {
                if all[i].1 {
                    tp += 1;
                } else {
                    fp += 1;
                }
                i += 1;
            }
            r.fpr.push(fp as f64 / nn);
            r.tpr.push(tp as f64 / np);
            r.thresholds.push(s);
        }
        r
    }

    /// The bootstrap as first written: each resample in draw order.
    fn bootstrap_reference(pos: &[f64], neg: &[f64], reps: usize, level: f64, seed: u64) -> Interval {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb007_57a9);
        let mut vals: Vec<f64> = (0..reps)
            .map(|_| {
                let bp: Vec<f64> = (0..pos.len()).map(|_| pos[rng.random_range(0..pos.len())]).collect();
                let bn: Vec<f64> = (0..neg.len()).map(|_| neg[rng.random_range(0..neg.len())]).collect();
                auc(&roc_reference(&bp, &bn))
            })
            .collect();
        vals.sort_by(f64::total_cmp);
        let q = |p: f64| vals[((p * (reps - 1) as f64).round() as usize).min(reps - 1)];
        Interval {
            lo: q((1.0 - level) / 2.0),
            hi: q((1.0 + level) / 2.0),
            level,
        }
    }

    /// The merged ROC and the counted resamples give exactly (bit for bit) what sorting all
    /// scores together and resampling in draw order gave: with ties, ±0, infinities, one-sided
    /// inputs and unequal sizes.
    #[test]
    fn merged_roc_and_sorted_resamples_equal_the_reference_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for case in 0..60 {
            let (np, nn) = (1 + case % 13 * 7, 1 + case % 5 * 11);
            let draw = |rng: &mut ChaCha8Rng| -> f64 {
                match rng.random_range(0..10) {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f64::INFINITY,
                    3 => f64::NEG_INFINITY,
                    4 => (rng.random_range(0..4) as f64) * 0.5,
                    _ => rng.random::<f64>() * 2.0 - 1.0,
                }
            };
            let pos: Vec<f64> = (0..np).map(|_| draw(&mut rng)).collect();
            let neg: Vec<f64> = (0..nn).map(|_| draw(&mut rng)).collect();
            let (a, b) = (roc(&pos, &neg).unwrap(), roc_reference(&pos, &neg));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.fpr), bits(&b.fpr), "case {case}");
            assert_eq!(bits(&a.tpr), bits(&b.tpr), "case {case}");
            assert_eq!(bits(&a.thresholds), bits(&b.thresholds), "case {case}");
            let ci = bootstrap(&pos, &neg, 50, 0.9, case as u64, |p, n| Ok(auc(&roc(p, n)?))).unwrap();
            let want = bootstrap_reference(&pos, &neg, 50, 0.9, case as u64);
            assert_eq!(
                (ci.lo.to_bits(), ci.hi.to_bits()),
                (want.lo.to_bits(), want.hi.to_bits()),
                "case {case}"
            );
        }
    }

    #[test]
    fn bootstrap_interval_contains_point_estimate() {
        let pos: Vec<f64> = (0..200).map(|i| (i as f64 * 0.37).sin() + 0.5).collect();
        let neg: Vec<f64> = (0..200).map(|i| (i as f64 * 0.91).sin()).collect();
        let a = auc(&roc(&pos, &neg).unwrap());
        let ci = bootstrap(&pos, &neg, 200, 0.95, 1, |p, n| Ok(auc(&roc(p, n)?))).unwrap();
        assert!(ci.lo < a && a < ci.hi, "{ci:?} {a}");
        let again = bootstrap(&pos, &neg, 200, 0.95, 1, |p, n| Ok(auc(&roc(p, n)?))).unwrap();
        assert_eq!(ci, again);
    }
}
