//! Number text shown to users: six significant digits. Here, below every module that states a
//! number in words (accountants, events, reports), so none of them depends on the report layer;
//! `report::num` re-exports these with the report's other formatters.

/// Human formatting of a number: up to 6 significant digits (trailing zeros dropped),
/// scientific outside [1e-4, 1e6),
/// `∞` for infinity. Used by Markdown, HTML and plot ticks.
pub fn fmt_num(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "∞".into() } else { "−∞".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    let a = x.abs();
    if (1e-4..1e6).contains(&a) {
        let digits = (5 - a.log10().floor() as i32).clamp(0, 10) as usize;
        let s = format!("{x:.digits$}");
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        };
        if s == "-0" {
            "0".into()
        } else {
            s
        }
    } else {
        let s = format!("{x:.5e}");
        // 1.23000e-7 -> 1.23e-7
        match s.split_once('e') {
            Some((m, e)) => {
                let m = if m.contains('.') {
                    m.trim_end_matches('0').trim_end_matches('.')
                } else {
                    m
                };
                format!("{m}e{e}")
            }
            None => s,
        }
    }
}

/// Six significant digits (as [`fmt_num`]): every number shown in text where full precision
/// would be noise (`σk/2 = 0.475`, `q = 0.00426667`); JSON and CSV keep full precision.
pub fn sig6(x: f64) -> String {
    fmt_num(x)
}
