//! Canaries for the one-run audit (Steinke, Nasr & Jagielski 2023, Algorithm 1): m records, each
//! included in the private training data independently with probability ½.
//!
//! dpaudit's canaries are random images with every value ±1 (far from the data, so a model that
//! trained on one remembers it, which makes the audit strong). Their contents may be public; the
//! inclusion bits are the secret the audit tests, so they are drawn from the operating system's
//! CSPRNG unless a seed is given. The file `<stem>.canaries.csv` (columns `id`, `included`,
//! `x0` … `x{d−1}`) is the auditor's record; the card names it with its SHA-256.

use std::path::Path;

use rand::{Rng, RngCore};

use super::Checkpoint;
use crate::error::{Error, Result};

/// A set of canaries.
#[derive(Debug, Clone, PartialEq)]
pub struct Canaries {
    /// Identifiers ("canary-0", …).
    pub ids: Vec<String>,
    /// Contents, row-major [m, dim].
    pub rows: Vec<f32>,
    /// Values per canary.
    pub dim: usize,
    /// Included in training (the secret).
    pub included: Vec<bool>,
}

impl Canaries {
    /// `m` random ±1 canaries of `dim` values, each included with probability ½, all drawn from
    /// `rng` (pass a CSPRNG seeded by the OS for a real audit).
    pub fn generate(m: usize, dim: usize, rng: &mut dyn RngCore) -> Self {
        let mut rows = Vec::with_capacity(m * dim);
        let mut included = Vec::with_capacity(m);
        for _ in 0..m {
            for _ in 0..dim {
                rows.push(if rng.random::<bool>() { 1.0 } else { -1.0 });
            }
            included.push(rng.random::<bool>());
        }
        Canaries {
            ids: (0..m).map(|i| format!("canary-{i}")).collect(),
            rows,
            dim,
            included,
        }
    }

    /// Number of canaries.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The included canaries' rows (they join the private training data).
    pub fn included_rows(&self) -> Vec<f32> {
        self.rows
            .chunks_exact(self.dim)
            .zip(&self.included)
            .filter(|(_, &b)| b)
            .flat_map(|(r, _)| r.iter().copied())
            .collect()
    }

    /// The CSV text.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("id,included");
        for j in 0..self.dim {
            s.push_str(&format!(",x{j}"));
        }
        s.push('\n');
        for ((id, row), inc) in self
            .ids
            .iter()
            .zip(self.rows.chunks_exact(self.dim))
            .zip(&self.included)
        {
            s.push_str(&format!("{id},{}", u8::from(*inc)));
            for v in row {
                s.push_str(&format!(",{v}"));
            }
            s.push('\n');
        }
        s
    }

    /// Reads a canaries file; errors name the file and line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        let mut lines = text.lines();
        let header = lines
            .next()
            .ok_or_else(|| Error::input("empty canaries file").with_file(path))?;
        let dim = header.split(',').count().saturating_sub(2);
        if !header.starts_with("id,included") || dim == 0 {
            return Err(Error::input("expected the header `id,included,x0,…`")
                .with_file(path)
                .with_line(1));
        }
        let mut c = Canaries {
            ids: Vec::new(),
            rows: Vec::new(),
            dim,
            included: Vec::new(),
        };
        for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad = |m: String| Error::input(m).with_file(path).with_line(i + 2);
            let v: Vec<&str> = line.split(',').map(str::trim).collect();
            if v.len() != dim + 2 {
                return Err(bad(format!("expected {} values, got {}", dim + 2, v.len())));
            }
            c.ids.push(v[0].to_string());
            c.included.push(match v[1] {
                "1" => true,
                "0" => false,
                o => {
                    return Err(bad(format!(
                        "`included` must be 1 or 0, got {}",
                        crate::error::token(o)
                    )))
                }
            });
            for x in &v[2..] {
                let f: f32 = x
                    .parse()
                    .map_err(|_| bad(format!("{} is not a number", crate::error::token(x))))?;
                if !f.is_finite() {
                    return Err(bad(format!("`{x}` is not finite")));
                }
                c.rows.push(f);
            }
        }
        if c.len() < 2 {
            return Err(Error::input("a canaries file needs at least 2 canaries").with_file(path));
        }
        Ok(c)
    }

    /// The canaries of a checkpoint trained with `--canaries` (hash checked against the card).
    pub fn of_checkpoint(ck: &Checkpoint) -> Result<Self> {
        let info = ck.card.canaries.as_ref().ok_or_else(|| {
            Error::input("this checkpoint was trained without canaries (train with --canaries m for --audit one-run)")
                .with_file(&ck.card_path)
        })?;
        Self::of_info(info, ck.dir(), &ck.card_path)
    }

    /// The canaries a card's `info` names in `dir` (SHA-256 and count checked against the card
    /// at `card_path`).
    pub fn of_info(info: &super::checkpoint::CanaryInfo, dir: &Path, card_path: &Path) -> Result<Self> {
        let p = dir.join(&info.file);
        let sha = crate::models::data::sha256_file(&p)?;
        if sha != info.sha256 {
            return Err(Error::field(
                "canaries.sha256",
                format!("{} has SHA-256 {sha}, the card says {}", p.display(), info.sha256),
            )
            .with_file(card_path));
        }
        let c = Self::load(&p)?;
        if c.len() != info.count {
            return Err(Error::field(
                "canaries.count",
                format!("the card says {}, {} has {}", info.count, p.display(), c.len()),
            )
            .with_file(card_path));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn canaries_round_trip_and_include_about_half() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let c = Canaries::generate(400, 3, &mut rng);
        let inc = c.included.iter().filter(|&&b| b).count();
        // Binomial(400, ½): mean 200, sd 10.
        assert!((160..=240).contains(&inc), "{inc}");
        assert_eq!(c.included_rows().len(), inc * 3);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.csv");
        std::fs::write(&p, c.to_csv()).unwrap();
        assert_eq!(Canaries::load(&p).unwrap(), c);
    }
}
