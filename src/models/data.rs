//! The digits data set and split manifests.
//!
//! Data: `fixtures/data/digits.csv.gz`, one image per line: 64 pixel values 0..16 then the label.
//! Pixels are scaled to [−1, 1] (x/8 − 1) for the denoisers.
//!
//! A split manifest (`fixtures/splits/*.toml`) lists disjoint row indices for `members` (the
//! private training set), `nonmembers` (held out, same distribution) and `public` (for
//! pretraining and RAPID's knowledge base), with the SHA-256 of the data file and of each list,
//! so that a checkpoint card can name exactly what it was trained on.

use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

use super::PIXELS;

/// Hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha256_hex_of(&[bytes])
}

/// Hex SHA-256 of the concatenation of `parts` (a file read into more than one buffer).
pub fn sha256_hex_of(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    crate::report::output::note_input(path);
    Ok(crate::limits::hash_file_capped(path, "file size")?.0)
}

/// Hash of an index list: SHA-256 of the decimal indices joined by commas (as written).
pub fn indices_sha256(ix: &[usize]) -> String {
    let s: Vec<String> = ix.iter().map(|i| i.to_string()).collect();
    sha256_hex(s.join(",").as_bytes())
}

/// Images scaled to [−1, 1] (row-major, `PIXELS` per image) and labels.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Path the data was read from.
    pub path: PathBuf,
    /// SHA-256 of the file.
    pub sha256: String,
    /// Pixels in [−1, 1], row-major.
    pub pixels: Vec<f32>,
    /// Digit labels.
    pub labels: Vec<u8>,
}

impl Dataset {
    /// Reads a digits-format CSV (optionally gzip-compressed, by extension `.gz`).
    pub fn load(path: &Path) -> Result<Self> {
        let raw = crate::limits::read_file_capped(path, "file size", crate::limits::BINARY_INPUT_BYTE)?;
        let sha256 = sha256_hex(&raw);
        let text = if path.extension().is_some_and(|e| e == "gz") {
            // Decompression is capped: a small gzip file cannot inflate past the memory cap.
            crate::limits::read_text_capped(flate2::read::GzDecoder::new(&raw[..]), path).map_err(|mut e| {
                if e.kind == crate::ErrorKind::Io {
                    e.message = format!("not a gzip-compressed CSV: {}", e.message);
                    e.kind = crate::ErrorKind::Input;
                }
                e
            })?
        } else {
            String::from_utf8(raw).map_err(|_| Error::input("not UTF-8 text").with_file(path))?
        };
        let mut pixels = Vec::new();
        let mut labels = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let vals: Vec<&str> = line.split(',').collect();
            if vals.len() != PIXELS + 1 {
                return Err(Error::input(format!(
                    "expected {} comma-separated values (64 pixels and a label), got {}",
                    PIXELS + 1,
                    vals.len()
                ))
                .with_file(path)
                .with_line(i + 1));
            }
            for (j, v) in vals.iter().enumerate() {
                let x: f64 = v.trim().parse().map_err(|_| {
                    Error::input(format!("column {}: {} is not a number", j + 1, crate::error::token(v)))
                        .with_file(path)
                        .with_line(i + 1)
                })?;
                if j < PIXELS {
                    if !(0.0..=16.0).contains(&x) {
                        return Err(Error::input(format!("column {}: pixel {x} outside 0..16", j + 1))
                            .with_file(path)
                            .with_line(i + 1));
                    }
                    pixels.push((x / 8.0 - 1.0) as f32);
                } else {
                    labels.push(x as u8);
                }
            }
        }
        if labels.is_empty() {
            return Err(Error::input("no rows").with_file(path));
        }
        Ok(Dataset {
            path: path.to_path_buf(),
            sha256,
            pixels,
            labels,
        })
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The rows `ix`, concatenated.
    pub fn rows(&self, ix: &[usize]) -> Vec<f32> {
        let mut out = Vec::with_capacity(ix.len() * PIXELS);
        for &i in ix {
            out.extend_from_slice(&self.pixels[i * PIXELS..(i + 1) * PIXELS]);
        }
        out
    }
}

/// Which part of a split a command works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The rows the model is trained on.
    Members,
    /// Held-out rows from the same distribution.
    Nonmembers,
    /// Public rows (pretraining, RAPID's knowledge base).
    Public,
}

/// A member / non-member / public split of a data file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitManifest {
    /// Format version; must be 1.
    pub schema_version: u32,
    /// The data file, relative to the repository root (or absolute).
    pub data: String,
    /// SHA-256 of the data file.
    pub data_sha256: String,
    /// Seed of the split.
    pub seed: u64,
    /// SHA-256 of the member index list.
    pub members_sha256: String,
    /// SHA-256 of the non-member index list.
    pub nonmembers_sha256: String,
    /// SHA-256 of the public index list.
    pub public_sha256: String,
    /// Member row indices.
    pub members: Vec<usize>,
    /// Non-member row indices.
    pub nonmembers: Vec<usize>,
    /// Public row indices.
    pub public: Vec<usize>,
}

impl SplitManifest {
    /// A seeded random split of `n` rows: `n_members` members, `n_nonmembers` non-members, the
    /// rest public. Lists are sorted.
    pub fn random(data: &Dataset, data_name: &str, n_members: usize, n_nonmembers: usize, seed: u64) -> Result<Self> {
        Self::random_rows(data.len(), &data.sha256, data_name, n_members, n_nonmembers, seed)
    }

    /// A seeded random split of `n` rows of the data file `data_name` (SHA-256 `data_sha256`):
    /// `n_members` members, `n_nonmembers` non-members, the rest public. Lists are sorted.
    pub fn random_rows(
        n: usize,
        data_sha256: &str,
        data_name: &str,
        n_members: usize,
        n_nonmembers: usize,
        seed: u64,
    ) -> Result<Self> {
        if n_members == 0 || n_nonmembers == 0 || n_members + n_nonmembers > n {
            return Err(Error::field(
                "--members",
                format!("need members ≥ 1, non-members ≥ 1 and members + non-members ≤ {n}"),
            ));
        }
        let mut ix: Vec<usize> = (0..n).collect();
        ix.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        let mut members = ix[..n_members].to_vec();
        let mut nonmembers = ix[n_members..n_members + n_nonmembers].to_vec();
        let mut public = ix[n_members + n_nonmembers..].to_vec();
        members.sort_unstable();
        nonmembers.sort_unstable();
        public.sort_unstable();
        Ok(SplitManifest {
            schema_version: 1,
            data: data_name.to_string(),
            data_sha256: data_sha256.to_string(),
            seed,
            members_sha256: indices_sha256(&members),
            nonmembers_sha256: indices_sha256(&nonmembers),
            public_sha256: indices_sha256(&public),
            members,
            nonmembers,
            public,
        })
    }

    /// Reads and checks a manifest: schema, list hashes, disjointness.
    pub fn load(path: &Path) -> Result<Self> {
        let m: SplitManifest = crate::input::load_toml(path)?;
        if m.schema_version != 1 {
            return Err(Error::field(
                "schema_version",
                format!("unsupported schema_version {} (this dpaudit reads 1)", m.schema_version),
            )
            .with_file(path));
        }
        for (name, list, hash) in [
            ("members", &m.members, &m.members_sha256),
            ("nonmembers", &m.nonmembers, &m.nonmembers_sha256),
            ("public", &m.public, &m.public_sha256),
        ] {
            let h = indices_sha256(list);
            if &h != hash {
                return Err(Error::field(
                    format!("{name}_sha256"),
                    format!("the `{name}` list hashes to {h}, the manifest says {hash}: the list was edited"),
                )
                .with_file(path));
            }
        }
        let mut all: Vec<usize> = m
            .members
            .iter()
            .chain(&m.nonmembers)
            .chain(&m.public)
            .copied()
            .collect();
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::input(format!("row {} appears in more than one list (or twice)", w[0])).with_file(path));
        }
        if m.members.is_empty() || m.nonmembers.is_empty() {
            return Err(Error::input("members and nonmembers must both be non-empty").with_file(path));
        }
        Ok(m)
    }

    /// Checks the manifest against a loaded data file (hash and index range).
    pub fn check_data(&self, data: &Dataset) -> Result<()> {
        if self.data_sha256 != data.sha256 {
            return Err(Error::field(
                "data_sha256",
                format!(
                    "split was made for data with SHA-256 {}, but {} has {}",
                    self.data_sha256,
                    data.path.display(),
                    data.sha256
                ),
            ));
        }
        let n = data.len();
        if let Some(i) = self
            .members
            .iter()
            .chain(&self.nonmembers)
            .chain(&self.public)
            .find(|&&i| i >= n)
        {
            return Err(Error::input(format!("row index {i} out of range (data has {n} rows)")));
        }
        Ok(())
    }

    /// The row indices of part `p`.
    pub fn part(&self, p: Part) -> &[usize] {
        match p {
            Part::Members => &self.members,
            Part::Nonmembers => &self.nonmembers,
            Part::Public => &self.public,
        }
    }

    /// The manifest as TOML.
    pub fn to_toml(&self) -> Result<String> {
        let mut s = String::from(
            "# Member / non-member / public split of the digits data (row indices, 0-based).\n\
             # Lists are disjoint; each *_sha256 is SHA-256 of the list joined by commas.\n",
        );
        s.push_str(&toml::to_string(self).map_err(|e| Error::input(e.to_string()))?);
        Ok(s)
    }
}

/// Standard normal draws from `rng`.
pub fn normals<R: rand::Rng + ?Sized>(rng: &mut R, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| rng.sample::<f32, _>(rand_distr::StandardNormal))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake() -> Dataset {
        Dataset {
            path: "x.csv".into(),
            sha256: "abc".into(),
            pixels: vec![0.0; 10 * PIXELS],
            labels: vec![0; 10],
        }
    }

    #[test]
    fn split_is_disjoint_and_hashed() {
        let m = SplitManifest::random(&fake(), "x.csv", 3, 4, 7).unwrap();
        assert_eq!(m.members.len() + m.nonmembers.len() + m.public.len(), 10);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.toml");
        std::fs::write(&p, m.to_toml().unwrap()).unwrap();
        let back = SplitManifest::load(&p).unwrap();
        assert_eq!(back, m);
        // Editing a list breaks its hash.
        let mut bad = m.clone();
        bad.members[0] = bad.public[0];
        std::fs::write(&p, toml::to_string(&bad).unwrap()).unwrap();
        let e = SplitManifest::load(&p).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("members_sha256"));
        // Overlap with correct hashes is still caught.
        bad.members_sha256 = indices_sha256(&bad.members);
        std::fs::write(&p, toml::to_string(&bad).unwrap()).unwrap();
        let e = SplitManifest::load(&p).unwrap_err();
        assert!(e.message.contains("more than one list"), "{e}");
    }
}
