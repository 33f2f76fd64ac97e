//! `model info`: what a diffusers checkpoint folder holds (architecture, parameter count, file
//! hashes, scheduler), as the terminal text and the shared [`Report`] (one fact per line);
//! `model eval` (the UNet's raw output on a batch, to check against PyTorch) and `model grads`
//! (per-sample gradients of the ε-prediction loss), each from a request the CLI fills in.

use std::path::{Path, PathBuf};

use crate::data::npy;
use crate::error::{Error, Result};
use crate::models::diffusers::DiffusersCheckpoint;
use crate::models::precision::Precision;
use crate::models::{device, DeviceChoice};
use crate::report::{self, Report};

/// `model keygen`: a new Ed25519 key pair in `out` (created when missing; existing key files are
/// never replaced). Returns the files written.
pub fn keygen(out: &Path) -> Result<Vec<std::path::PathBuf>> {
    crate::provenance::write_key_pair(out)
}

/// Loads the checkpoint at `dir` (on the CPU) and describes it.
pub fn info(dir: &Path) -> Result<super::Outcome> {
    let ck = DiffusersCheckpoint::load(dir, &candle_core::Device::Cpu)?;
    let mut text = ck.info();
    text.push_str(&dp_line(&ck)?);
    let mut r =
        Report::new(format!("dpaudit model info: {}", dir.display()), report::command_line()).for_command("model");
    for (role, p) in crate::models::folder::folder_files(dir) {
        r.add_input(role, &p)?;
    }
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            r.fact(k.trim(), v.trim());
        }
    }
    r.conclude();
    Ok(super::Outcome::new(r, text))
}

/// The folder's DP line: the settings and the ε its card records (with the ledger that supports
/// it and its SHA-256), that it was trained without DP, or that no dpaudit card says either.
fn dp_line(ck: &DiffusersCheckpoint) -> Result<String> {
    use crate::models::diffusers_train::{UnetCard, CARD, LEDGER};
    use crate::report::export::fmt_num as f;
    let dir = ck.config_path.parent().unwrap_or(&ck.dir);
    let Some(card) = UnetCard::load(dir)? else {
        return Ok(format!(
            "DP: not recorded (no {CARD}: trained outside dpaudit; nothing here states a DP guarantee)\n"
        ));
    };
    let Some(dp) = card.dp else {
        return Ok("DP: none (the card records a training without DP: no privacy guarantee)\n".into());
    };
    let eps = match (dp.epsilon, dp.epsilon_accountant.as_deref()) {
        (Some(e), Some(a)) => format!("ε = {} at δ = {}, {a} as the card records", f(e), f(dp.delta)),
        (Some(e), None) => format!("ε = {} at δ = {} (as the card records)", f(e), f(dp.delta)),
        _ => format!("δ = {}, ε not recorded", f(dp.delta)),
    };
    let ledger = dir.join(LEDGER);
    let sha = if ledger.is_file() {
        crate::data::digits::sha256_file(&ledger)?
    } else {
        "missing".into()
    };
    Ok(format!(
        "DP: DP-SGD with noise multiplier {}, clip {}, sample rate {}, {} steps: {eps}; ledger {} sha256: {sha} (`dpaudit check {}` accounts it again)\n",
        f(dp.noise_multiplier),
        f(dp.clip),
        f(dp.sample_rate),
        dp.steps,
        dp.ledger,
        ck.dir.display()
    ))
}

/// `model relocate`: the request the CLI fills in.
#[derive(Debug, Clone)]
pub struct RelocateRequest {
    /// The folder where it is now (a `train --unet` output folder or a pipeline folder).
    pub folder: PathBuf,
    /// Sign the relocated folder again with this key (the key that signed it).
    pub sign_key: Option<PathBuf>,
    /// Remove the signature instead (the folder is then unsigned).
    pub drop_signature: bool,
}

/// The value after `flag` in a recorded command line (`--out X` or `--out=X`), if any.
fn flag_value<'a>(command: &'a str, flag: &str) -> Option<&'a str> {
    let mut it = command.split(' ');
    while let Some(t) = it.next() {
        if t == flag {
            return it.next();
        }
        if let Some(v) = t.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v);
        }
    }
    None
}

/// `command` with the values of `--out` and `--init` replaced (tokens split at spaces, as the
/// card records them).
fn with_paths(command: &str, out: &str, init: Option<&str>) -> String {
    let mut toks: Vec<String> = command.split(' ').map(str::to_string).collect();
    let mut i = 0;
    while i < toks.len() {
        let new = match toks[i].split_once('=').map_or(toks[i].as_str(), |(f, _)| f) {
            "--out" => Some(out),
            "--init" => init,
            _ => None,
        };
        if let Some(v) = new {
            if let Some((f, _)) = toks[i].split_once('=') {
                toks[i] = format!("{f}={v}");
            } else if i + 1 < toks.len() {
                toks[i + 1] = v.to_string();
                i += 1;
            }
        }
        i += 1;
    }
    toks.join(" ")
}

/// `text` with every mention of the path `old` that stands alone (after a space, `(` or a
/// backtick, before a space, `)`, `,`, a backtick, `/` (a file in it) or the line's end)
/// replaced by `new`: a path inside a longer name is left alone.
fn replace_path(text: &str, old: &str, new: &str) -> String {
    if old.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(old) {
        let before = rest[..i].chars().next_back().or_else(|| out.chars().next_back());
        let after = rest[i + old.len()..].chars().next();
        let starts = before.is_none_or(|c| matches!(c, ' ' | '(' | '`'));
        let ends = after.is_none_or(|c| matches!(c, ' ' | ')' | ',' | '`' | '/' | '\n' | '\r'));
        out.push_str(&rest[..i]);
        out.push_str(if starts && ends { new } else { old });
        rest = &rest[i + old.len()..];
    }
    out.push_str(rest);
    out
}

/// `training.json` with its `"command"` replaced and a `"relocated"` note after it, edited as
/// text so that every other byte (key order, indentation, numbers) stays as the trainer wrote it;
/// `None` when the old command is not found there.
fn relocate_record(text: &str, old: &str, new: &str, note: &str) -> Result<Option<String>> {
    let q = |s: &str| serde_json::to_string(s).map_err(|e| Error::input(e.to_string()));
    let key = format!("\"command\": {}", q(old)?);
    let Some(at) = text.find(&key) else {
        return Ok(None);
    };
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let indent = &text[line_start..at];
    let mut out = format!("{}\"command\": {}", &text[..at], q(new)?);
    if !text.contains("\"relocated\":") {
        out.push_str(&format!(",\n{indent}\"relocated\": {}", q(note)?));
    }
    out.push_str(&text[at + key.len()..]);
    Ok(Some(out))
}

/// `model relocate`: after a trained folder was moved (trained with `--out` in a scratch folder,
/// shipped elsewhere), rewrites what its card, ledger comment and `training.json` say about
/// where the folders are: `--out` becomes the folder's location now and `--init` the location of
/// the folder the card records as its start, so that the recorded command reruns from here; the
/// card's `training.relocated` says that this was done. Nothing that decides a number changes:
/// the ledger's event, the weights, config and scheduler are not touched, and the card seals the
/// new ledger bytes (`dp.ledger_sha256`).
///
/// Refused, before anything is written, when the folder does not match its card (a file changed
/// after training: relocating would seal the change) or when it is signed and neither
/// `sign_key` (the key that signed it) nor `drop_signature` is given. A folder without a card
/// (trained outside dpaudit) gets only its `training.json` rewritten (nothing seals it).
pub fn relocate(req: &RelocateRequest) -> Result<String> {
    use crate::data::digits::sha256_file;
    use crate::models::diffusers_train::{lexical, UnetCard, CARD, LEDGER, RELEASED, TRAINING};
    use crate::report::output::write_atomic;
    let dir = &req.folder;
    let unet = crate::models::folder::unet_dir(dir)
        .ok_or_else(|| Error::input("not a diffusers folder (no config.json, nor unet/config.json)").with_file(dir))?;
    let here = lexical(&unet);
    let out_now = here.display().to_string();
    let card_path = unet.join(CARD);
    let card = UnetCard::load(&unet)?;
    let record_path = unet.join(TRAINING);
    let record = if record_path.is_file() {
        Some(crate::input::read_to_string(&record_path)?)
    } else {
        None
    };
    let old_command = match (&card, &record) {
        (Some(c), _) => c.training.command.clone(),
        (None, Some(r)) => serde_json::from_str::<serde_json::Value>(r)
            .ok()
            .and_then(|v| v.get("command").and_then(|c| c.as_str()).map(str::to_string))
            .ok_or_else(|| Error::field("command", "no training command recorded").with_file(&record_path))?,
        (None, None) => {
            return Err(Error::input(format!(
                "neither a dpaudit card ({CARD}) nor a training record ({TRAINING}): nothing records where this folder was trained"
            ))
            .with_file(dir))
        }
    };
    let old_out = flag_value(&old_command, "--out").map(str::to_string);
    let old_init = flag_value(&old_command, "--init").map(str::to_string);
    // --init: where the card records the start folder (relative to the card), if it is there.
    let init_now = match card.as_ref().and_then(|c| c.training.init.as_deref()) {
        Some(rel) => {
            let p = lexical(&crate::models::card::resolve_card_path(
                &card_path,
                "training.init",
                rel,
            )?);
            p.is_dir().then(|| p.display().to_string())
        }
        None => None,
    };
    // An --init folder that neither the card locates nor exists any more (a scratch folder of
    // an earlier run that was not shipped) reads `<previous folder>`: a path that names nothing
    // would only mislead.
    let init_gone = init_now.is_none() && old_init.as_deref().is_some_and(|o| !Path::new(o).exists());
    let init_now = init_now.or_else(|| init_gone.then(|| "<previous folder>".to_string()));
    let new_command = with_paths(&old_command, &out_now, init_now.as_deref());
    if new_command == old_command {
        return Ok(format!(
            "{}: its recorded command already names this folder{}; nothing written",
            dir.display(),
            if init_now.is_some() {
                " and its --init folder"
            } else {
                ""
            }
        ));
    }
    // The note says what changed, not the old paths (scratch folders, which mean nothing here).
    let note = format!(
        "moved after training: `dpaudit model relocate` rewrote --out{} in `command` to where the folders are now (the run wrote elsewhere{}); the event, weights, config and scheduler are the run's",
        if init_now.is_some() { " and --init" } else { "" },
        if init_gone { "; its --init folder is not shipped" } else { "" },
    );
    // Before anything is written: the folder must still be what its card seals.
    let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let mut rewritten = Vec::new();
    if let Some(mut card) = card {
        let seal = |field: &str, p: &Path, want: &str| -> Result<()> {
            let got = sha256_file(p)?;
            if got != want {
                return Err(Error::field(
                    field,
                    format!(
                        "{} has SHA-256 {got}, the card records {want}: the folder changed after training; relocate seals again only a folder that matches its card",
                        p.display()
                    ),
                )
                .with_file(&card_path));
            }
            Ok(())
        };
        seal("config_sha256", &unet.join("config.json"), &card.config_sha256)?;
        seal(
            "weights_sha256",
            &unet.join(crate::models::folder::WEIGHTS),
            &card.weights_sha256,
        )?;
        if let Some(s) = crate::models::folder::find_scheduler(&unet, dir) {
            seal("scheduler_sha256", &s, &card.scheduler_sha256)?;
        }
        for c in [&card.canaries, &card.gradient_canaries].into_iter().flatten() {
            seal("canaries.sha256", &unet.join(&c.file), &c.sha256)?;
            if let (Some(o), Some(w)) = (&c.observations, &c.observations_sha256) {
                seal("canaries.observations_sha256", &unet.join(o), w)?;
            }
        }
        if let Some(dp) = card.dp.as_mut() {
            let ledger = unet.join(&dp.ledger);
            let text = crate::input::read_to_string(&ledger)?;
            if let Some(want) = &dp.ledger_sha256 {
                seal("dp.ledger_sha256", &ledger, want)?;
            }
            // Only comment lines change: the event a checker accounts is byte for byte the same.
            // The recorded command first, then any other mention of the two folders (`from
            // --init DIR`, `after the ledger of --init (DIR)`), the longer path first.
            let mut swaps = vec![(old_command.clone(), new_command.clone())];
            let mut paths: Vec<(String, String)> = Vec::new();
            if let (Some(o), Some(n)) = (&old_init, &init_now) {
                paths.push((o.clone(), n.clone()));
            }
            if let Some(o) = &old_out {
                paths.push((o.clone(), out_now.clone()));
            }
            paths.sort_by_key(|(o, _)| std::cmp::Reverse(o.len()));
            swaps.extend(paths);
            let new_text: String = text
                .split_inclusive('\n')
                .map(|l| {
                    if l.starts_with('#') {
                        let l = l.replace(old_command.as_str(), &new_command);
                        swaps[1..].iter().fold(l, |acc, (o, n)| replace_path(&acc, o, n))
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            dp.ledger_sha256 = Some(crate::report::sha256_hex(new_text.as_bytes()));
            if new_text != text {
                files.push((ledger, new_text.into_bytes()));
                rewritten.push(format!("{LEDGER} (comment lines only: the event is unchanged)"));
            }
        }
        if let (Some(o), Some(n)) = (&old_init, &init_now) {
            if card.config_source == format!("--init {o}") {
                card.config_source = format!("--init {n}");
            }
        }
        card.training.command = new_command.clone();
        card.training.relocated = Some(note.clone());
        files.push((card_path.clone(), card.text()?.into_bytes()));
        rewritten.push(format!(
            "{CARD} (command, training.relocated{})",
            if card.dp.is_some() {
                ", the ledger's SHA-256"
            } else {
                ""
            }
        ));
    }
    if let Some(r) = &record {
        if let Some(t) = relocate_record(r, &old_command, &new_command, &note)? {
            files.push((record_path.clone(), t.into_bytes()));
            rewritten.push(format!("{TRAINING} (command, relocated)"));
        }
    }
    // A signature covers the files rewritten above: sign again with its key, or drop it.
    let sig_path = unet.join(crate::provenance::SIGNATURE);
    let mut signature = "unsigned".to_string();
    if sig_path.is_file() {
        let status = crate::provenance::verify_folder(&unet, &RELEASED, &[])?;
        let crate::provenance::Signing::Signed { key: signer, .. } = status else {
            return Err(Error::input("a signature file that does not verify").with_file(&sig_path));
        };
        match (&req.sign_key, req.drop_signature) {
            (Some(k), _) => {
                let key = crate::provenance::load_secret(k)?;
                let id = crate::provenance::key_id(&key.verifying_key());
                if id != signer {
                    return Err(Error::field(
                        "--sign-key",
                        format!("the folder is signed by {signer}, this key is {id}: relocate signs again only with the key that signed it"),
                    )
                    .with_file(k));
                }
                let mut set: Vec<(String, Vec<u8>)> = Vec::new();
                for name in RELEASED {
                    let p = unet.join(name);
                    let bytes = match files.iter().find(|(f, _)| *f == p) {
                        Some((_, b)) => b.clone(),
                        None if p.is_file() => std::fs::read(&p).map_err(|e| Error::io(&p, &e))?,
                        None => continue,
                    };
                    set.push((name.to_string(), bytes));
                }
                let (name, bytes) = crate::provenance::sign_set(&set, &key)?;
                files.push((unet.join(name), bytes));
                signature = format!("signed again by {signer}");
            }
            (None, true) => signature = format!("signature of {signer} removed (the folder is now unsigned)"),
            (None, false) => {
                return Err(Error::input(format!(
                    "signed by {signer}: relocating rewrites files the signature covers; give --sign-key with that key to sign the relocated folder again, or --drop-signature to leave it unsigned"
                ))
                .with_file(&sig_path))
            }
        }
    }
    // The folder's output-set manifest (what every reader checks a member against): each
    // member must still be as recorded, and the rewritten ones get their new SHA-256.
    let manifest_path = unet.join(crate::input::manifest_name(None));
    if manifest_path.is_file() {
        let text = crate::input::read_to_string(&manifest_path)?;
        let mut m: crate::input::Manifest = serde_json::from_str(&text)
            .map_err(|e| Error::input(format!("not a dpaudit output manifest: {e}")).with_file(&manifest_path))?;
        for entry in &mut m.files {
            let p = unet.join(&entry.name);
            let (sha, bytes) = match files.iter().find(|(f, _)| *f == p) {
                Some((_, b)) => (crate::report::sha256_hex(b), b.len() as u64),
                None => {
                    let got = sha256_file(&p)?;
                    if got != entry.sha256 {
                        return Err(Error::field(
                            "sha256",
                            format!(
                                "{} has SHA-256 {got}, the folder's manifest records {}: the folder changed after it was written; relocate seals again only a folder that matches its manifest",
                                p.display(),
                                entry.sha256
                            ),
                        )
                        .with_file(&manifest_path));
                    }
                    continue;
                }
            };
            entry.sha256 = sha;
            entry.bytes = bytes;
        }
        if req.drop_signature && req.sign_key.is_none() {
            m.files.retain(|e| e.name != crate::provenance::SIGNATURE);
        }
        let bytes = serde_json::to_vec_pretty(&m).map_err(|e| Error::input(format!("manifest: {e}")))?;
        files.push((manifest_path, bytes));
    }
    for (p, bytes) in &files {
        crate::input::rewrite_in_place(p);
        write_atomic(p, bytes, true)?;
    }
    if req.drop_signature && sig_path.is_file() && req.sign_key.is_none() {
        std::fs::remove_file(&sig_path).map_err(|e| Error::io(&sig_path, &e))?;
    }
    Ok(format!(
        "relocated {}: --out {} → {}{}\nrewrote: {}\nsignature: {signature}",
        dir.display(),
        old_out.as_deref().unwrap_or("(none)"),
        out_now,
        match (&old_init, &init_now) {
            (Some(o), Some(n)) => format!(", --init {o} → {n}"),
            _ => String::new(),
        },
        rewritten.join(", ")
    ))
}

/// `model eval`: the raw output of a diffusers UNet on a float32 batch.
#[derive(Debug, Clone)]
pub struct EvalRequest {
    /// The diffusers folder.
    pub checkpoint: PathBuf,
    /// float32 .npy (B, C, H, W).
    pub input: PathBuf,
    /// int64 (or int32, or float32) .npy (B,).
    pub timesteps: PathBuf,
    /// Output .npy.
    pub out: PathBuf,
    /// Replace an existing output.
    pub force: bool,
    /// Images per forward pass (≥ 1).
    pub batch: usize,
    /// The backend: the device the model runs on.
    pub device: DeviceChoice,
    /// The arithmetic of the forward on a GPU.
    pub precision: Precision,
}

/// Runs `model eval`: checks the inputs (shapes, finite values, timesteps ≥ 0), runs the UNet at
/// the request's backend and precision, writes float32 (B, C_out, H, W). Returns a note for
/// stderr.
pub fn eval(e: &EvalRequest) -> Result<String> {
    if e.batch == 0 {
        return Err(Error::field("--batch", "must be ≥ 1"));
    }
    crate::report::output::check_file(&e.out, e.force).map_err(|err| err.with_field("--out"))?;
    let dev = device::select(e.device)?;
    crate::models::precision::check_device(e.precision, &dev)?;
    let mut ck = DiffusersCheckpoint::load(&e.checkpoint, &dev)?;
    ck.precision = e.precision;
    let (shape, xs) = f32_batch(&e.input)?;
    let t = npy::read(&e.timesteps)?;
    let ts: Vec<f64> = match (t.to_i64(), t.to_f32()) {
        (Some(v), _) => {
            if let Some(bad) = v.iter().find(|&&s| s < 0) {
                return Err(Error::input(format!("negative timestep {bad}")).with_file(&e.timesteps));
            }
            v.iter().map(|&s| s as f64).collect()
        }
        (None, Some(v)) => {
            all_finite(&v, &e.timesteps)?;
            v.iter().map(|&s| s as f64).collect()
        }
        _ => {
            return Err(
                Error::input(format!("element type {} (expected int64 <i8)", t.dtype.descr())).with_file(&e.timesteps),
            )
        }
    };
    if t.shape != [shape[0]] {
        return Err(Error::input(format!(
            "shape {:?}, expected ({},) — one timestep per input image",
            t.shape, shape[0]
        ))
        .with_file(&e.timesteps));
    }
    let shape = [shape[0], shape[1], shape[2], shape[3]];
    let y = ck
        .eval(&xs, shape, &ts, e.batch)
        .map_err(|err| err.with_file(&e.input))?;
    let out_shape = [shape[0], ck.model.config.out_channels, shape[2], shape[3]];
    crate::report::output::write_atomic(&e.out, &npy::encode_f32(&out_shape, &y), e.force)?;
    Ok(format!(
        "wrote {} ({}×{}×{}×{} float32; backend: {} on {}, precision {})",
        e.out.display(),
        out_shape[0],
        out_shape[1],
        out_shape[2],
        out_shape[3],
        ck.executor(),
        device::describe(&dev),
        e.precision.as_str()
    ))
}

/// `model grads`: per-sample gradients of the ε-prediction loss of a diffusers UNet on a batch.
#[derive(Debug, Clone)]
pub struct GradsRequest {
    /// The diffusers folder.
    pub checkpoint: PathBuf,
    /// float32 .npy of x_t (B, C, H, W).
    pub input: PathBuf,
    /// int64 or float32 .npy (B,).
    pub timesteps: PathBuf,
    /// float32 .npy of ε (B, C, H, W).
    pub noise: PathBuf,
    /// Clip norm C of the clipped sum (None: norms only).
    pub clip: Option<f64>,
    /// Output folder.
    pub out: PathBuf,
    /// One backward pass per sample (the reference).
    pub per_sample_loop: bool,
    /// The hand-written CPU pass of one sample at a time.
    pub hand_written: bool,
    /// Replace existing outputs.
    pub force: bool,
}

/// Runs `model grads`: writes `norms.npy` (each sample's gradient norm) and, with a clip norm,
/// `clipped_sum.safetensors` = Σᵢ min(1, C/(‖gᵢ‖ + 1e-6)) gᵢ (Abadi et al. 2016, Alg. 1, the
/// sum DP-SGD adds noise to). Returns a note for stderr.
pub fn grads(g: &GradsRequest) -> Result<String> {
    use crate::models::unet2d::train::{clip_and_sum, per_sample_norms, TrainUnet};
    for f in ["norms.npy", "clipped_sum.safetensors"] {
        crate::report::output::check_file(&g.out.join(f), g.force).map_err(|e| e.with_field("--out"))?;
    }
    if let Some(c) = g.clip {
        if !(c > 0.0 && c.is_finite()) {
            return Err(Error::field("--clip", "must be a finite number > 0"));
        }
    }
    let dev = candle_core::Device::Cpu;
    let dir = crate::models::folder::unet_dir(&g.checkpoint).ok_or_else(|| {
        Error::input("not a diffusers checkpoint (no config.json, nor unet/config.json)").with_file(&g.checkpoint)
    })?;
    let cpath = dir.join("config.json");
    let config = crate::models::unet2d::Unet2dConfig::parse(&crate::input::read_to_string(&cpath)?, &cpath)?;
    let wpath = dir.join(crate::models::folder::WEIGHTS);
    let (tensors, _, _) = crate::models::diffusers::read_weights(&wpath, &dev)?;
    let model = TrainUnet::from_tensors(&config, tensors, &wpath, &dev)?;
    let (shape, x) = f32_batch(&g.input)?;
    let (eshape, e) = f32_batch(&g.noise)?;
    if eshape != shape {
        return Err(Error::input(format!("shape {eshape:?}, the input has {shape:?}")).with_file(&g.noise));
    }
    let t = npy::read(&g.timesteps)?;
    let ts: Vec<f64> = t
        .to_i64()
        .map(|v| v.iter().map(|&s| s as f64).collect())
        .or_else(|| t.to_f32().map(|v| v.iter().map(|&s| s as f64).collect()))
        .ok_or_else(|| Error::input("expected int64 or float32 timesteps").with_file(&g.timesteps))?;
    if ts.len() != shape[0] || ts.iter().any(|&s| s < 0.0) {
        return Err(
            Error::input(format!("expected {} timesteps ≥ 0, one per input image", shape[0])).with_file(&g.timesteps),
        );
    }
    let write_norms = |norms: &[f64]| -> Result<()> {
        std::fs::create_dir_all(&g.out).map_err(|err| Error::io(&g.out, &err))?;
        let nf: Vec<f32> = norms.iter().map(|&v| v as f32).collect();
        crate::report::output::write_atomic(&g.out.join("norms.npy"), &npy::encode_f32(&[nf.len()], &nf), g.force)
    };
    let save = |sum: &std::collections::HashMap<String, candle_core::Tensor>| -> Result<()> {
        let p = g.out.join("clipped_sum.safetensors");
        candle_core::safetensors::save(sum, &p).map_err(|err| Error::model(err.to_string()))
    };
    if g.hand_written {
        use crate::models::unet2d::grad_cpu::{unsupported, CpuGrad};
        if let Some(why) = unsupported(&config) {
            return Err(
                Error::field("--hand-written", format!("the hand-written pass does not cover {why}")).with_file(&cpath),
            );
        }
        let mut pass = CpuGrad::new(&model, [shape[1], shape[2], shape[3]]).map_err(|err| err.with_file(&g.input))?;
        let r = pass.clipped_sum(&x, &ts, &e, g.clip, 1.0)?;
        write_norms(&r.norms)?;
        if g.clip.is_some() {
            save(&pass.to_tensors(&r.sum, &dev)?)?;
        }
        return Ok(format!(
            "wrote per-sample gradient norms of {} samples to {} (hand-written CPU pass)",
            r.norms.len(),
            g.out.display()
        ));
    }
    let dims = (shape[0], shape[1], shape[2], shape[3]);
    let xt = candle_core::Tensor::from_vec(x, dims, &dev)?;
    let et = candle_core::Tensor::from_vec(e, dims, &dev)?;
    let per = if g.per_sample_loop {
        model.per_sample_grads_loop(&xt, &ts, &et)
    } else {
        model.per_sample_grads(&xt, &ts, &et)
    }
    .map_err(|err| err.with_file(&g.input))?;
    let norms = per_sample_norms(&per)?;
    write_norms(&norms)?;
    if let Some(c) = g.clip {
        let (sum, _) = clip_and_sum(&per, c)?;
        save(&sum)?;
    }
    Ok(format!(
        "wrote per-sample gradient norms of {} samples to {}",
        norms.len(),
        g.out.display()
    ))
}

/// A float32 (B, C, H, W) batch with finite values.
fn f32_batch(p: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let x = npy::read(p)?;
    let v = x
        .to_f32()
        .ok_or_else(|| Error::input(format!("element type {} (expected float32 <f4)", x.dtype.descr())).with_file(p))?;
    if x.shape.len() != 4 {
        return Err(Error::input(format!("shape {:?}, expected (B, C, H, W)", x.shape)).with_file(p));
    }
    all_finite(&v, p)?;
    Ok((x.shape.clone(), v))
}

/// Refuses a batch with a NaN or infinite value, naming the file and the first such element.
fn all_finite(v: &[f32], p: &Path) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::input(format!("element {i} is {}: a model input must be finite", v[i])).with_file(p)),
        None => Ok(()),
    }
}
