//! What an (ε, δ) guarantee allows a membership-inference attacker: every test has
//! TPR ≤ e^ε·FPR + δ and 1 − FPR ≤ e^ε(1 − TPR) + δ (Kairouz, Oh & Viswanath 2015, Thm 2.1), so
//! the balanced accuracy is at most (e^ε + δ)/(1 + e^ε) (diffusion-sampling-privacy App. G after
//! Triastcyn & Faltings 2020, with δ added). The one line of scale every stated guarantee carries.

/// ASR ≤ (e^ε + δ)/(1 + e^ε) for (ε, δ)-DP (written to stay finite for large ε).
pub fn asr_limit_eps_delta(epsilon: f64, delta: f64) -> f64 {
    if !epsilon.is_finite() {
        return 1.0;
    }
    // (e^ε + δ)/(1 + e^ε) = (1 + δ e^{−ε})/(1 + e^{−ε})
    let em = (-epsilon).exp();
    ((1.0 + delta * em) / (1.0 + em)).min(1.0)
}

/// TPR ≤ min(e^ε·FPR + δ, 1 − e^{−ε}(1 − δ − FPR)) for (ε, δ)-DP.
pub fn tpr_limit_eps_delta(epsilon: f64, delta: f64, fpr: f64) -> f64 {
    if !epsilon.is_finite() {
        return 1.0;
    }
    let a = epsilon.exp() * fpr + delta;
    let b = 1.0 - (-epsilon).exp() * (1.0 - delta - fpr);
    a.min(b).clamp(0.0, 1.0)
}
