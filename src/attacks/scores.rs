//! Per-record attack scores in and out: `mia --scores-out FILE.csv` writes one row per (record,
//! attack, step) and `mia --scores FILE.csv` recomputes every metric, interval, audit bound and
//! theory comparison from such a file, whichever tool produced it.
//!
//! Columns (header required, order free): `record_id` (any text), `member` (1/0 or true/false:
//! in the training data or not), `attack` (loss, secmi, pia, empirical), `t` (step), `score`
//! (higher = member), and optionally `set`: `split` (member/non-member evaluation, the default)
//! or `canary` (the one-run audit's canaries; `member` is then "included in training").

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::mia::AttackKind;
use crate::error::{Error, Result};

/// Which population a score row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
pub fn to_csv(records: &[ScoreRecord]) -> String {
    let mut s = String::from("record_id,member,attack,t,score,set\n");
    for r in records {
        let id = if r.record_id.contains([',', '"', '\n']) {
            format!("\"{}\"", r.record_id.replace('"', "\"\""))
        } else {
            r.record_id.clone()
        };
        s.push_str(&format!(
            "{id},{},{},{},{},{}\n",
            u8::from(r.member),
            r.attack.as_str(),
            r.t,
            r.score,
            r.set.as_str()
        ));
    }
    s
}

/// Reads a scores CSV; errors name the file, line and column.
pub fn read_csv(path: &Path) -> Result<Vec<ScoreRecord>> {
    let text = crate::input::read_to_string(path)?;
    parse_csv(&text).map_err(|e| e.with_file(path))
}

/// Parses scores CSV text (see the module docs).
pub fn parse_csv(text: &str) -> Result<Vec<ScoreRecord>> {
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
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = rec.map_err(|e| Error::input(e.to_string()).with_line(line))?;
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
        if score.is_nan() {
            return Err(Error::field("score", "NaN is not a score").with_line(line));
        }
        let set = match cset.map(|c| rec.get(c).unwrap_or("")) {
            None | Some("") | Some("split") => ScoreSet::Split,
            Some("canary") => ScoreSet::Canary,
            Some(other) => {
                return Err(Error::field("set", format!("`{other}` is not `split` or `canary`")).with_line(line))
            }
        };
        out.push(ScoreRecord {
            record_id: get(ci, "record_id")?.to_string(),
            member,
            attack,
            t,
            score,
            set,
        });
    }
    if out.is_empty() {
        return Err(Error::input("no score rows"));
    }
    Ok(out)
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
        let back = parse_csv(&to_csv(&recs)).unwrap();
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
}
