//! Per-record attack scores in and out: `mia --scores-out FILE.csv` writes one row per (record,
//! attack, step) and `mia --scores FILE.csv` recomputes every metric, interval, audit bound and
//! theory comparison from such a file, whichever tool produced it.
//!
//! Columns (header required, order free): `record_id` (any text), `member` (1/0 or true/false:
//! in the training data or not), `attack` (loss, secmi, pia, empirical), `t` (step), `score`
//! (higher = member), and optionally `set`: `split` (member/non-member evaluation, the default)
//! or `canary` (the one-run audit's canaries; `member` is then "included in training").
//! Written through the one CSV writer ([`crate::report::csv_out`]): a record id a spreadsheet
//! would run as a formula is written with a leading `'`, which reading removes again.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::mia::AttackKind;
use crate::error::{Error, Result};

/// Which population a score row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreSet {
    /// Members against non-members of the split.
    Split,
    /// One-run audit canaries (member = included in training).
    Canary,
}

impl ScoreSet {
    /// As written in the `set` column.
    pub fn as_str(self) -> &'static str {
        match self {
            ScoreSet::Split => "split",
            ScoreSet::Canary => "canary",
        }
    }
}

/// One score row.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRecord {
    /// Record identifier (a data row index for dpaudit's own runs).
    pub record_id: String,
    /// In the training data (for canaries: included).
    pub member: bool,
    /// The attack.
    pub attack: AttackKind,
    /// The step attacked.
    pub t: usize,
    /// The score (higher = member).
    pub score: f64,
    /// The population.
    pub set: ScoreSet,
}

/// The CSV text of `records` (floats in shortest round-trip form, so reading gives them back
/// bit for bit).
pub fn to_csv(records: &[ScoreRecord]) -> Result<String> {
    let mut w = crate::report::csv_out::Csv::new();
    w.row(["record_id", "member", "attack", "t", "score", "set"])?;
    for r in records {
        w.row([
            r.record_id.as_str(),
            if r.member { "1" } else { "0" },
            r.attack.as_str(),
            &r.t.to_string(),
            &r.score.to_string(),
            r.set.as_str(),
        ])?;
    }
    w.into_string()
}

/// Reads a scores CSV; errors name the file, line and column.
pub fn read_csv(path: &Path) -> Result<Vec<ScoreRecord>> {
    Ok(ScoresFile::load(path)?.records)
}

/// A scores file as read: its records in file order, the line each came from, and its path, so
/// checks made after reading still name the file and line.
#[derive(Debug, Clone)]
pub struct ScoresFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// Its rows.
    pub records: Vec<ScoreRecord>,
    /// The line of each row (1-based; the header is line 1).
    pub lines: Vec<usize>,
}

impl ScoresFile {
    /// Reads and checks a scores CSV (see [`parse_csv`]); every split (attack, t) pair must also
    /// hold at least 2 members and 2 non-members, which the metrics and their held-out halves
    /// need. Errors name the file, and the line where there is one.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        let (records, lines) = parse_lines(&text).map_err(|e| e.with_file(path))?;
        for p in group(&records, ScoreSet::Split) {
            let (m, n) = (
                p.members.iter().filter(|&&b| b).count(),
                p.members.iter().filter(|&&b| !b).count(),
            );
            if m < 2 || n < 2 {
                return Err(Error::field(
                    "member",
                    format!(
                        "{} at t = {} has {m} member and {n} non-member scores; the metrics need at least 2 of each",
                        p.attack.as_str(),
                        p.t
                    ),
                )
                .with_file(path));
            }
        }
        Ok(ScoresFile {
            path: path.to_path_buf(),
            records,
            lines,
        })
    }

    /// Checks the canary rows (`set = canary`) for the one-run audit: every attack and step that
    /// has canary rows scores the same canaries with the same inclusion bits, and, given the
    /// canaries of the training run (`want`, from the checkpoint's card), exactly those canaries
    /// with their recorded inclusion bits. `source` says in messages where `want` comes from.
    /// Duplicate rows and conflicting labels were refused when the file was read.
    pub fn check_canaries(&self, want: Option<(&crate::models::canary::Canaries, &str)>) -> Result<()> {
        let at = |i: usize| self.lines.get(i).copied().unwrap_or(0);
        let bad = |i: Option<usize>, msg: String| {
            let e = Error::field("record_id", msg).with_file(&self.path);
            match i {
                Some(i) => Err(e.with_line(at(i))),
                None => Err(e),
            }
        };
        let canary_rows: Vec<usize> = (0..self.records.len())
            .filter(|&i| self.records[i].set == ScoreSet::Canary)
            .collect();
        if let Some(&i) = canary_rows
            .iter()
            .find(|&&i| self.records[i].attack.target() == super::mia::Target::Sampler)
        {
            return bad(
                Some(i),
                format!(
                    "canary row for the {} attack: it attacks the sampler, not the training run (canary rows need loss, secmi or pia)",
                    self.records[i].attack.as_str()
                ),
            );
        }
        // Pairs in order of first appearance, with their canary ids.
        let mut pairs: Vec<((AttackKind, usize), std::collections::BTreeSet<&str>)> = Vec::new();
        for &i in &canary_rows {
            let r = &self.records[i];
            match pairs.iter_mut().find(|(k, _)| *k == (r.attack, r.t)) {
                Some((_, ids)) => {
                    ids.insert(&r.record_id);
                }
                None => pairs.push(((r.attack, r.t), std::iter::once(r.record_id.as_str()).collect())),
            }
        }
        if let Some((c, source)) = want {
            let included: std::collections::HashMap<&str, bool> = c
                .ids
                .iter()
                .map(String::as_str)
                .zip(c.included.iter().copied())
                .collect();
            if canary_rows.is_empty() {
                return bad(
                    None,
                    format!(
                        "no canary rows (set = canary): the one-run audit scores the {} canaries of {}",
                        c.len(),
                        source
                    ),
                );
            }
            for &i in &canary_rows {
                let r = &self.records[i];
                match included.get(r.record_id.as_str()) {
                    None => {
                        return bad(
                            Some(i),
                            format!(
                                "canary {} is not one of the {} canaries of {}",
                                shown(&r.record_id),
                                c.len(),
                                source
                            ),
                        )
                    }
                    Some(&inc) if inc != r.member => {
                        return bad(
                            Some(i),
                            format!(
                                "canary {} is labelled {} here, {} has it {}",
                                shown(&r.record_id),
                                if r.member {
                                    "included (member = 1)"
                                } else {
                                    "not included (member = 0)"
                                },
                                source,
                                if inc { "included" } else { "not included" }
                            ),
                        )
                    }
                    Some(_) => {}
                }
            }
            for ((a, t), ids) in &pairs {
                if ids.len() != c.len() {
                    return bad(
                        None,
                        format!(
                            "{} at t = {t} has {} canary rows; {} has {} canaries, each to be scored once",
                            a.as_str(),
                            ids.len(),
                            source,
                            c.len()
                        ),
                    );
                }
            }
        } else if let Some(((a0, t0), first)) = pairs.first() {
            for ((a, t), ids) in &pairs[1..] {
                if ids != first {
                    return bad(
                        None,
                        format!(
                            "{} at t = {t} scores {} canaries, {} at t = {t0} scores {}: every attack and step must score the same canaries",
                            a.as_str(),
                            ids.len(),
                            a0.as_str(),
                            first.len()
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

/// A record id as messages show it: quoted, or its length when it is long.
fn shown(id: &str) -> String {
    if id.chars().count() <= 64 {
        format!("`{id}`")
    } else {
        format!("an id of {} characters", id.chars().count())
    }
}

/// Parses scores CSV text (see the module docs). A record may appear once per attack, step and
/// set, and with one label: a row repeating (record_id, attack, t, set), or giving a record the
/// other `member` label than an earlier row of its set, is refused with both lines.
pub fn parse_csv(text: &str) -> Result<Vec<ScoreRecord>> {
    Ok(parse_lines(text)?.0)
}

/// [`parse_csv`], with the line of each record.
fn parse_lines(text: &str) -> Result<(Vec<ScoreRecord>, Vec<usize>)> {
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| Error::input(format!("cannot read the header: {e}")).with_line(1))?
        .clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let need = |name: &str| {
        col(name).ok_or_else(|| {
            Error::input(format!(
                "missing column `{name}` (need record_id, member, attack, t, score; optional set)"
            ))
            .with_line(1)
        })
    };
    let (ci, cm, ca, ct, cs) = (
        need("record_id")?,
        need("member")?,
        need("attack")?,
        need("t")?,
        need("score")?,
    );
    let cset = col("set");
    let mut out = Vec::new();
    let mut lines = Vec::new();
    let mut seen: HashMap<(String, AttackKind, usize, ScoreSet), usize> = HashMap::new();
    let mut labels: HashMap<(String, ScoreSet), (bool, usize)> = HashMap::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| Error::input(e.to_string()).with_line(i + 2))?;
        // The line the record starts on (a quoted id may span lines).
        let line = rec.position().map_or(i + 2, |p| p.line() as usize);
        let get = |c: usize, name: &str| {
            rec.get(c)
                .ok_or_else(|| Error::field(name, "missing value").with_line(line))
        };
        let member = match get(cm, "member")? {
            "1" | "true" | "True" | "TRUE" => true,
            "0" | "false" | "False" | "FALSE" => false,
            other => return Err(Error::field("member", format!("`{other}` is not 1/0 or true/false")).with_line(line)),
        };
        let attack: AttackKind = get(ca, "attack")?.parse().map_err(|e: Error| e.with_line(line))?;
        let t: usize = get(ct, "t")?.parse().map_err(|_| {
            Error::field(
                "t",
                format!(
                    "{} is not a step (an integer ≥ 0)",
                    crate::error::token(rec.get(ct).unwrap_or(""))
                ),
            )
            .with_line(line)
        })?;
        let score: f64 = get(cs, "score")?.parse().map_err(|_| {
            Error::field(
                "score",
                format!("{} is not a number", crate::error::token(rec.get(cs).unwrap_or(""))),
            )
            .with_line(line)
        })?;
        if !score.is_finite() {
            return Err(Error::field(
                "score",
                format!("{score} is not a score (a score must be a finite number)"),
            )
            .with_line(line));
        }
        let set = match cset.map(|c| rec.get(c).unwrap_or("")) {
            None | Some("") | Some("split") => ScoreSet::Split,
            Some("canary") => ScoreSet::Canary,
            Some(other) => {
                return Err(Error::field("set", format!("`{other}` is not `split` or `canary`")).with_line(line))
            }
        };
        let record_id = crate::report::csv_out::unfield(get(ci, "record_id")?).to_string();
        let who = |set: ScoreSet| match set {
            ScoreSet::Split => "record",
            ScoreSet::Canary => "canary",
        };
        match labels.get(&(record_id.clone(), set)) {
            Some(&(was, first)) if was != member => {
                let name = |m: bool| match (set, m) {
                    (ScoreSet::Split, true) => "a member",
                    (ScoreSet::Split, false) => "a non-member",
                    (ScoreSet::Canary, true) => "included",
                    (ScoreSet::Canary, false) => "not included",
                };
                return Err(Error::field(
                    "member",
                    format!(
                        "{} {} is {} here and {} on line {first}: one record cannot be both",
                        who(set),
                        shown(&record_id),
                        name(member),
                        name(was)
                    ),
                )
                .with_line(line));
            }
            Some(_) => {}
            None => {
                labels.insert((record_id.clone(), set), (member, line));
            }
        }
        if let Some(first) = seen.insert((record_id.clone(), attack, t, set), line) {
            return Err(Error::field(
                "record_id",
                format!(
                    "{} {} appears twice for {} at t = {t} (first on line {first})",
                    who(set),
                    shown(&record_id),
                    attack.as_str()
                ),
            )
            .with_line(line));
        }
        out.push(ScoreRecord {
            record_id,
            member,
            attack,
            t,
            score,
            set,
        });
        lines.push(line);
    }
    if out.is_empty() {
        return Err(Error::input("no score rows"));
    }
    Ok((out, lines))
}

/// Scores of one (attack, t) pair of one set, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct PairScores {
    /// The attack.
    pub attack: AttackKind,
    /// The step.
    pub t: usize,
    /// Record ids, scores and labels, aligned.
    pub ids: Vec<String>,
    /// Scores.
    pub scores: Vec<f64>,
    /// Member labels.
    pub members: Vec<bool>,
}

impl PairScores {
    /// Member scores.
    pub fn pos(&self) -> Vec<f64> {
        self.scores
            .iter()
            .zip(&self.members)
            .filter(|(_, &m)| m)
            .map(|(s, _)| *s)
            .collect()
    }
    /// Non-member scores.
    pub fn neg(&self) -> Vec<f64> {
        self.scores
            .iter()
            .zip(&self.members)
            .filter(|(_, &m)| !m)
            .map(|(s, _)| *s)
            .collect()
    }
}

/// Groups the rows of `set` by (attack, t), in order of first appearance.
pub fn group(records: &[ScoreRecord], set: ScoreSet) -> Vec<PairScores> {
    let mut out: Vec<PairScores> = Vec::new();
    for r in records.iter().filter(|r| r.set == set) {
        let ix = match out.iter().position(|p| p.attack == r.attack && p.t == r.t) {
            Some(i) => i,
            None => {
                out.push(PairScores {
                    attack: r.attack,
                    t: r.t,
                    ids: Vec::new(),
                    scores: Vec::new(),
                    members: Vec::new(),
                });
                out.len() - 1
            }
        };
        let p = &mut out[ix];
        p.ids.push(r.record_id.clone());
        p.scores.push(r.score);
        p.members.push(r.member);
    }
    out
}

/// Records for one pair: `ids`, `members` and `scores` aligned.
pub fn records(
    attack: AttackKind,
    t: usize,
    set: ScoreSet,
    ids: &[String],
    members: &[bool],
    scores: &[f64],
) -> Vec<ScoreRecord> {
    ids.iter()
        .zip(members)
        .zip(scores)
        .map(|((id, &member), &score)| ScoreRecord {
            record_id: id.clone(),
            member,
            attack,
            t,
            score,
            set,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trips_bit_for_bit() {
        let recs = vec![
            ScoreRecord {
                record_id: "12".into(),
                member: true,
                attack: AttackKind::Pia,
                t: 10,
                score: -0.1 - 0.2,
                set: ScoreSet::Split,
            },
            ScoreRecord {
                record_id: "a,b".into(),
                member: false,
                attack: AttackKind::Loss,
                t: 50,
                score: -1e-300,
                set: ScoreSet::Canary,
            },
        ];
        let back = parse_csv(&to_csv(&recs).unwrap()).unwrap();
        assert_eq!(back, recs);
    }

    #[test]
    fn bad_rows_name_line_and_column() {
        let e = parse_csv("record_id,member,attack,t,score\n1,1,loss,5,0.5\n2,maybe,loss,5,0.1\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.to_string().contains("`member`"), "{e}");
        let e = parse_csv("record_id,member,attack,score\n1,1,loss,0.5\n").unwrap_err();
        assert!(e.to_string().contains("missing column `t`"), "{e}");
        let e = parse_csv("record_id,member,attack,t,score\n1,1,lira,5,0.5\n").unwrap_err();
        assert!(e.to_string().contains("unknown attack `lira`"), "{e}");
        // Without a `set` column every row is a split row; columns in any order.
        let r = parse_csv("score,t,attack,member,record_id\n0.5,5,loss,true,x\n").unwrap();
        assert_eq!(r[0].set, ScoreSet::Split);
        assert!(r[0].member && r[0].t == 5);
    }

    const HEAD: &str = "record_id,member,attack,t,score,set\n";

    #[test]
    fn a_record_appears_once_per_attack_and_step_with_one_label() {
        // The same record at another step, another attack or in the other set is fine.
        let ok = format!(
            "{HEAD}7,1,loss,10,0.5,split\n7,1,loss,50,0.5,split\n7,1,pia,10,0.5,split\n7,0,loss,10,0.5,canary\n"
        );
        assert_eq!(parse_csv(&ok).unwrap().len(), 4);
        // A repeated (record, attack, t, set) names both lines.
        let e = parse_csv(&format!(
            "{HEAD}7,1,loss,10,0.5,split\n8,0,loss,10,0.1,split\n7,1,loss,10,0.9,split\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(4));
        assert_eq!(
            e.to_string(),
            "line 4: field `record_id`: record `7` appears twice for loss at t = 10 (first on line 2)"
        );
        // A member at one step and a non-member at another is refused, whatever the attack.
        let e = parse_csv(&format!("{HEAD}7,1,loss,10,0.5,split\n7,0,pia,50,0.5,split\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: field `member`: record `7` is a non-member here and a member on line 2: one record cannot be both"
        );
        let e = parse_csv(&format!("{HEAD}c,0,loss,10,0.5,canary\nc,1,loss,10,0.5,canary\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("canary `c` is included here and not included on line 2"),
            "{e}"
        );
        // A quoted id spanning two lines: the next record's line is counted from the file.
        let e = parse_csv(&format!(
            "{HEAD}\"a\nb\",1,loss,10,0.5,split\n\"a\nb\",1,loss,10,0.5,split\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("(first on line 2)"), "{e}");
    }

    fn file_with(body: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.csv");
        std::fs::write(&p, format!("{HEAD}{body}")).unwrap();
        (dir, p)
    }

    #[test]
    fn a_split_pair_needs_two_members_and_two_non_members_and_the_error_names_the_file() {
        let (_d, p) = file_with("1,1,loss,10,0.5,split\n2,1,loss,10,0.4,split\n3,0,loss,10,0.1,split\n");
        let e = ScoresFile::load(&p).unwrap_err();
        assert_eq!(e.file.as_deref(), Some(p.as_path()));
        assert!(
            e.to_string()
                .ends_with("loss at t = 10 has 2 member and 1 non-member scores; the metrics need at least 2 of each"),
            "{e}"
        );
        // Canary rows alone (a one-run audit) have no split pair to check.
        let (_d, p) = file_with("c0,1,loss,10,0.5,canary\nc1,0,loss,10,0.4,canary\n");
        assert_eq!(ScoresFile::load(&p).unwrap().lines, vec![2, 3]);
    }

    #[test]
    fn canary_rows_must_be_the_training_runs_canaries() {
        let c = crate::models::canary::Canaries {
            ids: vec!["c0".into(), "c1".into(), "c2".into()],
            rows: vec![0.0; 3],
            dim: 1,
            included: vec![true, false, true],
        };
        let want = Some((&c, "the canaries file of x.toml"));
        let rows = |bits: &[(&str, u8)], pairs: &[(&str, u32)]| {
            let mut s = String::new();
            for (a, t) in pairs {
                for (id, b) in bits {
                    s.push_str(&format!("{id},{b},{a},{t},0.5,canary\n"));
                }
            }
            s
        };
        let all = [("c0", 1), ("c1", 0), ("c2", 1)];
        let check = |body: String| {
            let (_d, p) = file_with(&body);
            ScoresFile::load(&p)
                .unwrap()
                .check_canaries(want)
                .map_err(|e| (e.to_string(), e.line))
        };
        check(rows(&all, &[("loss", 10), ("pia", 50)])).unwrap();
        let (e, line) = check(rows(&[("c0", 1), ("c1", 1), ("c2", 1)], &[("loss", 10)])).unwrap_err();
        assert_eq!(line, Some(3));
        assert!(
            e.ends_with(
                "canary `c1` is labelled included (member = 1) here, the canaries file of x.toml has it not included"
            ),
            "{e}"
        );
        let (e, _) = check(rows(&[("c0", 1), ("c9", 0), ("c2", 1)], &[("loss", 10)])).unwrap_err();
        assert!(
            e.contains("canary `c9` is not one of the 3 canaries of the canaries file of x.toml"),
            "{e}"
        );
        let (e, line) = check(rows(&all[..2], &[("loss", 10)])).unwrap_err();
        assert_eq!(line, None);
        assert!(
            e.ends_with(
                "loss at t = 10 has 2 canary rows; the canaries file of x.toml has 3 canaries, each to be scored once"
            ),
            "{e}"
        );
        let (e, _) = check(
            "1,1,loss,10,0.5,split\n2,1,loss,10,0.4,split\n3,0,loss,10,0.1,split\n4,0,loss,10,0.1,split\n".into(),
        )
        .unwrap_err();
        assert!(e.contains("no canary rows"), "{e}");
        let (e, _) = check(rows(&all, &[("empirical", 10)])).unwrap_err();
        assert!(e.contains("the empirical attack: it attacks the sampler"), "{e}");
        // Without the run's canaries, every attack and step must still score the same ones.
        let (_d, p) = file_with(&(rows(&all, &[("loss", 10)]) + &rows(&all[..2], &[("pia", 10)])));
        let e = ScoresFile::load(&p).unwrap().check_canaries(None).unwrap_err();
        assert!(
            e.to_string()
                .contains("pia at t = 10 scores 2 canaries, loss at t = 10 scores 3"),
            "{e}"
        );
        let (_d, p) = file_with(&rows(&all, &[("loss", 10), ("pia", 10)]));
        ScoresFile::load(&p).unwrap().check_canaries(None).unwrap();
    }
}
