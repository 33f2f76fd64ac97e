//! Terminal summaries (`--format text`) of the reports built by [`super::audit`]: `account`
//! and `check`.

use std::fmt::Write as _;

use crate::accountants::sound;
use crate::accountants::BoundKind;
use crate::report::export::fmt_num;
use crate::report::progress::{paint, Tone};
use crate::report::{Report, Verdict};

/// `text` wrapped at spaces to `width` characters; continuation lines are indented four
/// spaces more than the first. A word longer than the width is cut.
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    if text.chars().count() <= width {
        // Fits: kept as is (aligned columns keep their spaces).
        return vec![text.to_string()];
    }
    let indent: String = text.chars().take_while(|c| *c == ' ').collect();
    let cont = format!("{indent}    ");
    let mut out = Vec::new();
    let mut cur = indent.clone();
    let mut cur_len = cur.chars().count();
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let wl = word.chars().count();
        if !empty && cur_len + 1 + wl > width {
            out.push(std::mem::replace(&mut cur, cont.clone()));
            cur_len = cont.chars().count();
            empty = true;
        }
        if !empty {
            cur.push(' ');
            cur_len += 1;
        }
        if cur_len + wl > width {
            // One word wider than the line: cut it.
            let room = width.saturating_sub(cur_len).max(1);
            let cut: String = word.chars().take(room).collect();
            cur.push_str(&cut);
            cur_len += room;
        } else {
            cur.push_str(word);
            cur_len += wl;
        }
        empty = false;
    }
    if !empty || out.is_empty() {
        out.push(cur.trim_end().to_string());
    }
    out
}

/// The first sentence of `text` (up to ". "), cut to `width` characters with `…`.
pub fn first_line(text: &str, width: usize) -> String {
    let first = match text.find(". ") {
        Some(i) => &text[..=i],
        None => text,
    };
    if first.chars().count() <= width {
        first.to_string()
    } else {
        let mut s: String = first.chars().take(width.saturating_sub(1)).collect();
        s = s.trim_end().to_string();
        s.push('…');
        s
    }
}

/// How a kind reads in a terminal (estimates shout: they are never guarantees).
pub(crate) fn kind_words(k: BoundKind) -> String {
    k.shouted().to_string()
}

/// The headline: the smallest sound ε (`by_eps`) or δ among the results.
fn headline(r: &Report, by_eps: bool) -> Option<&crate::accountants::Evidence> {
    use crate::accountants::sound::{tightest_upper, tightest_upper_delta};
    if by_eps {
        tightest_upper(&r.results)
    } else {
        tightest_upper_delta(&r.results)
    }
}

/// `account`: the event ledger, each accountant's answer with its kind, the skipped ones, and
/// the headline (smallest sound ε, or δ for the `--epsilon` question).
pub fn account(r: &Report) -> String {
    let mut s = String::new();
    let nb = r
        .assumptions
        .neighbouring
        .map(|n| n.to_string())
        .unwrap_or_else(|| "not stated".into());
    let _ = writeln!(s, "Event (neighbouring: {nb}):");
    if let Some(ev) = &r.event {
        for line in ev.ledger().lines() {
            let _ = writeln!(s, "  {line}");
        }
    }
    let by_eps = r.delta.is_some();
    match r.delta {
        Some(d) => {
            let _ = writeln!(s, "ε at δ = {}:", fmt_num(d));
        }
        None => {
            if let Some(e) = r.results.first() {
                let _ = writeln!(s, "δ at ε = {}:", fmt_num(e.epsilon));
            }
        }
    }
    for a in &r.results {
        let v = if by_eps {
            format!("ε = {}", fmt_num(a.epsilon))
        } else {
            format!("δ = {}", fmt_num(a.delta))
        };
        let _ = writeln!(s, "  {:<4} {v:<22} {}", a.source(), kind_words(a.kind));
        for d in &a.diagnostics {
            let tag = if d.severe { "WARNING" } else { "note" };
            let _ = writeln!(s, "         {tag} [{}]: {}", d.code, d.message);
        }
    }
    for k in &r.skipped {
        let _ = writeln!(s, "  {:<4} unsupported: {}", k.accountant.as_str(), k.reason);
    }
    let head = headline(r, by_eps);
    match head {
        Some(h) if by_eps => {
            let _ = writeln!(
                s,
                "Headline (smallest sound ε): ε = {} at δ = {} ({}, {})",
                fmt_num(h.epsilon),
                fmt_num(h.delta),
                h.source(),
                kind_words(h.kind)
            );
            restate_assumptions(&mut s, h);
        }
        Some(h) => {
            let _ = writeln!(
                s,
                "Headline (smallest sound δ): δ = {} at ε = {} ({}, {})",
                fmt_num(h.delta),
                fmt_num(h.epsilon),
                h.source(),
                kind_words(h.kind)
            );
            restate_assumptions(&mut s, h);
        }
        None => s.push_str("Headline: no sound bound available (only estimates); do not use them as a guarantee\n"),
    }
    s
}

/// Restates, under the headline, every assumption (`assumption_*` diagnostic) the headline's
/// number rests on that other accountants' numbers do not.
fn restate_assumptions(s: &mut String, h: &crate::accountants::Evidence) {
    for d in h.diagnostics.iter().filter(|d| d.code.starts_with("assumption_")) {
        let _ = writeln!(s, "  under: {}", d.message);
    }
}

/// `check`: one verdict line, coloured on a terminal unless `NO_COLOR`.
pub(crate) fn verdict_line(subject: &str, v: &Verdict, delta: Option<f64>, color: bool) -> String {
    let tone = match v.status {
        sound::Verdict::Holds => Tone::Good,
        sound::Verdict::Violated => Tone::Bad,
        sound::Verdict::NotDemonstrated | sound::Verdict::Unanswered => Tone::Unsure,
    };
    let word = paint(v.status.shouted(), tone, color);
    // The reason an ε is infinite (a non-private event), as the verdict's message states it.
    let why = match v.epsilon() {
        Some(e) if e.is_infinite() => v.message.split_once(" — ").map(|(_, w)| w).unwrap_or(""),
        _ => "",
    };
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" — {why}")
    };
    match (v.status, v.epsilon(), v.margin) {
        (sound::Verdict::Holds | sound::Verdict::Violated, Some(eps), Some(margin)) => format!(
            "{word} {subject}: sound ε = {} ({} {}) {} budget {} at δ = {}, margin {}{why}\n",
            fmt_num(eps),
            v.accountant().map(|a| a.as_str()).unwrap_or("?"),
            v.bound().map(|b| b.describe().to_string()).unwrap_or_default(),
            if v.status == sound::Verdict::Holds { "≤" } else { ">" },
            fmt_num(v.budget.unwrap_or(f64::NAN)),
            fmt_num(delta.or(v.delta()).unwrap_or(f64::NAN)),
            fmt_num(margin)
        ),
        _ => format!("{word} {subject}: {}\n", v.message),
    }
}

/// `account --format csv`: one row per accountant (`status` ok or unsupported with the
/// reason), numbers in shortest round-trip form; `headline` marks the smallest sound ε (or δ).
pub(crate) fn account_csv(r: &Report) -> crate::Result<Vec<u8>> {
    use crate::report::num;
    let mut w = crate::report::csv_out::Csv::new();
    w.row([
        "accountant",
        "status",
        "epsilon",
        "delta",
        "kind",
        "sound",
        "headline",
        "reason",
    ])?;
    let by_eps = r.delta.is_some();
    let head = headline(r, by_eps).map(|a| a.accountant);
    for a in &r.results {
        w.row([
            a.source().to_string(),
            "ok".into(),
            num::fmt(a.epsilon),
            num::fmt(a.delta),
            a.kind.as_str().into(),
            a.kind.is_sound().to_string(),
            (head == Some(a.accountant)).to_string(),
            String::new(),
        ])?;
    }
    for k in &r.skipped {
        w.row([
            k.accountant.as_str(),
            "unsupported",
            "",
            "",
            "",
            "",
            "false",
            k.reason.as_str(),
        ])?;
    }
    w.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_keeps_words_and_width() {
        let t = "  - [code] a long message that goes on and on past the width of the line";
        let w = wrap(t, 30);
        assert!(w.len() > 1 && w.iter().all(|l| l.chars().count() <= 30), "{w:?}");
        assert!(w[1].starts_with("      ") && w[0].starts_with("  - [code]"), "{w:?}");
        assert_eq!(
            w.join(" ").split_whitespace().collect::<Vec<_>>(),
            t.split_whitespace().collect::<Vec<_>>()
        );
        assert_eq!(wrap("short", 30), vec!["short".to_string()]);
        assert_eq!(wrap("", 30), vec![String::new()]);
        assert!(wrap(&"x".repeat(50), 20).iter().all(|l| l.chars().count() <= 20));
        assert_eq!(first_line("One. Two.", 80), "One.");
        assert_eq!(first_line("abcdef", 4), "abc…");
    }
}
