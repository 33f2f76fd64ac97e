//! Signed provenance: what a trainer releases (weights, card, ledger, canaries, config), bound
//! to an Ed25519 key (RFC 8032, `ed25519-dalek`).
//!
//! A hash in a card or ledger proves that the files agree with each other, never who wrote
//! them: anyone who edits a ledger can recompute every hash. A signature adds one thing: the
//! release is exactly what the holder of the secret key signed. `train --unet --sign-key FILE`
//! writes `dpaudit-signature.toml` into the released folder, in the same output set as the
//! files it covers: the SHA-256 of every released file, and the signature over that list.
//! Readers (`mia --trust-key`, `model info --trust-key`, `train --unet --init … --trust-key`)
//! check it ([`verify_folder`]): every covered file must still have its signed hash (else the
//! file is named as changed after signing), every released file present must be covered, and
//! with trusted keys configured the signer must be one of them. What still rests on trust is
//! the key holder: a signature says who vouches for the ledger, not that the ledger is true
//! (docs/reliability.md, "Signed provenance").
//!
//! Key files are one line of text: `dpaudit-ed25519-secret-key <64 hex digits>` (the 32-byte
//! seed; keep it private) and `dpaudit-ed25519-public-key <64 hex digits>`; `dpaudit model
//! keygen --out DIR` writes a pair.

use std::path::Path;

use ed25519_dalek::{Signature, Signer};
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The signature file of a released folder.
pub const SIGNATURE: &str = "dpaudit-signature.toml";
/// Schema tag of the signature file.
pub const SCHEMA: &str = "dpaudit.signature/1";
const SECRET_TAG: &str = "dpaudit-ed25519-secret-key";
const PUBLIC_TAG: &str = "dpaudit-ed25519-public-key";
/// The first line of every signed statement (domain separation).
const STATEMENT_HEAD: &str = "dpaudit signed release 1";

/// One signed file: its name in the folder and its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedFile {
    /// File name (no path separator).
    pub name: String,
    /// SHA-256, hex.
    pub sha256: String,
}

/// The signature file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// [`SCHEMA`].
    pub schema: String,
    /// The signer's public key (`ed25519:<hex>`).
    pub public_key: String,
    /// The files signed, sorted by name.
    pub files: Vec<SignedFile>,
    /// The Ed25519 signature over [`statement`] of `files`, hex.
    pub signature: String,
}

/// Whether a folder's release is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signing {
    /// No signature file: the ledger is the trainer's word.
    Unsigned,
    /// Signed, every covered file unchanged.
    Signed {
        /// The signer (`ed25519:<hex>`).
        key: String,
        /// The signer is one of the configured trusted keys.
        trusted: bool,
    },
}

impl Signing {
    /// One phrase for reports.
    pub fn describe(&self) -> String {
        match self {
            Signing::Unsigned => "unsigned: the ledger is the trainer's word".to_string(),
            Signing::Signed { key, trusted: true } => format!("signed by the trusted key {key}"),
            Signing::Signed { key, trusted: false } => {
                format!("signed by {key} (no trusted key configured: who holds it is not checked)")
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.trim();
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The key's name in reports and signature files: `ed25519:<hex of the public key>`.
pub(crate) fn key_id(k: &VerifyingKey) -> String {
    format!("ed25519:{}", hex(&k.to_bytes()))
}

/// The text signed for `files` (sorted by name): [`STATEMENT_HEAD`], then `<name> sha256 <hex>`
/// per line.
pub fn statement(files: &[SignedFile]) -> String {
    let mut sorted: Vec<&SignedFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut s = format!("{STATEMENT_HEAD}\n");
    for f in sorted {
        s.push_str(&format!("{} sha256 {}\n", f.name, f.sha256));
    }
    s
}

/// The one line of a key file with `tag`, or an error naming the file.
fn key_line<const N: usize>(path: &Path, tag: &str) -> Result<[u8; N]> {
    let text = crate::limits::read_input_text(path)?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or("");
    let bad = || {
        Error::input(format!(
            "not a dpaudit key file: expected one line `{tag} <{} hex digits>` (dpaudit model keygen writes a pair)",
            2 * N
        ))
        .with_file(path)
    };
    let rest = line.strip_prefix(tag).ok_or_else(bad)?;
    unhex::<N>(rest).ok_or_else(bad)
}

/// Reads a secret key file (`--sign-key`).
pub fn load_secret(path: &Path) -> Result<SigningKey> {
    Ok(SigningKey::from_bytes(&key_line::<32>(path, SECRET_TAG)?))
}

/// Reads a public key file (`--trust-key`).
pub(crate) fn load_public(path: &Path) -> Result<VerifyingKey> {
    let b = key_line::<32>(path, PUBLIC_TAG)?;
    VerifyingKey::from_bytes(&b)
        .map_err(|_| Error::input("not an Ed25519 public key (not a point of the curve)").with_file(path))
}

/// Reads every `--trust-key` file.
pub fn load_trusted(paths: &[std::path::PathBuf]) -> Result<Vec<VerifyingKey>> {
    paths.iter().map(|p| load_public(p)).collect()
}

/// A new key pair from the operating system's CSPRNG: (secret key file text, public key file
/// text).
pub fn generate() -> Result<(String, String)> {
    let mut seed = [0u8; 32];
    rand::TryRngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut seed)
        .map_err(|e| Error::input(format!("the operating system's random source failed: {e}")))?;
    let k = SigningKey::from_bytes(&seed);
    Ok((
        format!("{SECRET_TAG} {}\n", hex(&seed)),
        format!("{PUBLIC_TAG} {}\n", hex(&k.verifying_key().to_bytes())),
    ))
}

/// Writes a new key pair into `dir` (created when missing): `dpaudit-signing.key` (the secret,
/// mode 0600) and `dpaudit-signing.pub`; an existing key file is never replaced.
pub fn write_key_pair(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    crate::report::output::create_out_dir(dir)?;
    let (secret, public) = generate()?;
    let mut written = Vec::new();
    for (name, text, mode) in [
        ("dpaudit-signing.key", secret, 0o600),
        ("dpaudit-signing.pub", public, 0o644),
    ] {
        let p = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&p)
            .map_err(|e| Error::io(&p, &e))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(&p, &e))?;
        written.push(p);
    }
    Ok(written)
}

/// The signature file for the output set `files` (name, bytes), signed with `key`: to be
/// committed in the same set.
pub(crate) fn sign_set(files: &[(String, Vec<u8>)], key: &SigningKey) -> Result<(String, Vec<u8>)> {
    let signed: Vec<SignedFile> = files
        .iter()
        .filter(|(n, _)| n != SIGNATURE)
        .map(|(n, b)| SignedFile {
            name: n.clone(),
            sha256: crate::report::sha256_hex(b),
        })
        .collect();
    let mut sorted = signed.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let sig: Signature = key.sign(statement(&sorted).as_bytes());
    let file = SignatureFile {
        schema: SCHEMA.to_string(),
        public_key: key_id(&key.verifying_key()),
        files: sorted,
        signature: hex(&sig.to_bytes()),
    };
    let text = toml::to_string(&file).map_err(|e| Error::input(format!("signature file: {e}")))?;
    Ok((SIGNATURE.to_string(), text.into_bytes()))
}

/// Checks the signature of the folder `dir` (see the module docs). `released`: the names of the
/// files a release of this kind has; every one present must be covered. With `trusted` keys
/// configured, an unsigned folder, or one signed by another key, is refused.
pub fn verify_folder(dir: &Path, released: &[&str], trusted: &[VerifyingKey]) -> Result<Signing> {
    let p = dir.join(SIGNATURE);
    if !p.is_file() {
        if !trusted.is_empty() {
            return Err(Error::field(
                "--trust-key",
                format!(
                    "`{}` is not signed (no {SIGNATURE}), and a trusted key is configured: its ledger and card would be only the trainer's word",
                    dir.display()
                ),
            ));
        }
        return Ok(Signing::Unsigned);
    }
    let f: SignatureFile = crate::input::load_toml(&p)?;
    if f.schema != SCHEMA {
        return Err(Error::field("schema", format!("`{}` (this dpaudit reads {SCHEMA})", f.schema)).with_file(&p));
    }
    let bad_key = || Error::field("public_key", "not `ed25519:<64 hex digits>`").with_file(&p);
    let key_bytes = f
        .public_key
        .strip_prefix("ed25519:")
        .and_then(unhex::<32>)
        .ok_or_else(bad_key)?;
    let key = VerifyingKey::from_bytes(&key_bytes).map_err(|_| bad_key())?;
    let sig = unhex::<64>(&f.signature)
        .map(|b| Signature::from_bytes(&b))
        .ok_or_else(|| Error::field("signature", "not 128 hex digits").with_file(&p))?;
    key.verify_strict(statement(&f.files).as_bytes(), &sig).map_err(|_| {
        Error::field(
            "signature",
            format!(
                "does not verify for the files it lists under {}: the signature file was changed after signing",
                f.public_key
            ),
        )
        .with_file(&p)
    })?;
    for s in &f.files {
        if s.name.contains(['/', '\\']) || s.name.starts_with('.') {
            return Err(Error::field("files", format!("`{}` is not a file name of the folder", s.name)).with_file(&p));
        }
        let q = dir.join(&s.name);
        let got = crate::input::file_sha256(&q).ok();
        if got.as_deref() != Some(s.sha256.as_str()) {
            return Err(Error::input(format!(
                "changed after signing: {} signed SHA-256 {}, the file {}",
                f.public_key,
                s.sha256,
                got.map_or("is missing".to_string(), |g| format!("has {g}"))
            ))
            .with_file(&q));
        }
    }
    for name in released {
        if dir.join(name).is_file() && !f.files.iter().any(|s| s.name == *name) {
            return Err(Error::input(format!(
                "not covered by the signature {} (added after signing)",
                p.display()
            ))
            .with_file(dir.join(name)));
        }
    }
    let is_trusted = trusted.contains(&key);
    if !trusted.is_empty() && !is_trusted {
        return Err(Error::field(
            "--trust-key",
            format!(
                "`{}` is signed by {}, which is not a trusted key",
                dir.display(),
                f.public_key
            ),
        )
        .with_file(&p));
    }
    Ok(Signing::Signed {
        key: f.public_key,
        trusted: is_trusted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_set_verifies_and_any_change_is_named() {
        let d = tempfile::tempdir().unwrap();
        let key = SigningKey::from_bytes(&[3u8; 32]);
        let files = vec![
            ("a.toml".to_string(), b"ledger".to_vec()),
            ("w.bin".to_string(), b"weights".to_vec()),
        ];
        let (name, bytes) = sign_set(&files, &key).unwrap();
        for (n, b) in files.iter().chain(std::iter::once(&(name, bytes))) {
            std::fs::write(d.path().join(n), b).unwrap();
        }
        let vk = key.verifying_key();
        let s = verify_folder(d.path(), &["a.toml", "w.bin"], &[vk]).unwrap();
        assert_eq!(
            s,
            Signing::Signed {
                key: key_id(&vk),
                trusted: true
            }
        );
        let other = SigningKey::from_bytes(&[4u8; 32]).verifying_key();
        assert!(verify_folder(d.path(), &[], &[other]).is_err());
        std::fs::write(d.path().join("w.bin"), b"weightz").unwrap();
        let e = verify_folder(d.path(), &[], &[]).unwrap_err();
        assert!(
            e.to_string().contains("w.bin") && e.to_string().contains("changed after signing"),
            "{e}"
        );
    }
}
