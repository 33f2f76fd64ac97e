//! Image data sets of any size for diffusers checkpoints, and their member/non-member splits.
//!
//! Three inputs, all scaled to the [−1, 1] range diffusers models are trained on:
//! * the shipped MNIST digits (`fixtures/data/mnist/mnist-10k.u8.gz`: 10,000 records of a
//!   label byte and 28×28 pixel bytes; provenance in that folder's README): x/127.5 − 1;
//! * a `.npy` array (N, C, H, W): float32 values used as given (already in the model's range),
//!   or uint8 scaled x/127.5 − 1;
//! * a folder of 8-bit PNG images (grey → 1 channel, RGB → 3; alpha dropped), in file-name order.
//!
//! A split is the same [`SplitManifest`] TOML as for the digits (row indices, hashed lists, the
//! data file's SHA-256); for a PNG folder the hash covers every file name and its bytes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

use super::digits::{sha256_hex, SplitManifest};

/// Side of an MNIST image.
pub const MNIST_SIDE: usize = 28;

/// Images (N, C, H, W) scaled to the model's range, with labels when the source has them.
#[derive(Debug, Clone)]
pub struct ImageSet {
    /// Where the images came from.
    pub path: PathBuf,
    /// SHA-256 of the file (or of the folder's names and bytes).
    pub sha256: String,
    /// (C, H, W) of one image.
    pub shape: [usize; 3],
    /// All images (read them with [`ImageSet::rows`]).
    pixels: Pixels,
    /// Class labels (MNIST only).
    pub labels: Option<Vec<u8>>,
}

/// The images' values as loaded: MNIST records stay bytes (10,000 digits are 7.8 MB as bytes and
/// 31 MB as f32, and a run reads a few hundred of them), scaled when [`ImageSet::rows`] reads them.
#[derive(Debug, Clone)]
enum Pixels {
    /// Values in the model's range, flat row-major.
    F32(Vec<f32>),
    /// MNIST records of `1 + dim` bytes: a label, then the pixels (x/127.5 − 1 when read).
    Records(Vec<u8>),
}

/// At most this many images are read (keeps a hostile input from exhausting memory).
pub const MAX_IMAGES: usize = 1_000_000;
/// At most this many values in total.
pub const MAX_VALUES: usize = 1 << 30;

fn check_size(path: &Path, n: usize, shape: [usize; 3]) -> Result<()> {
    let per: usize = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or(usize::MAX);
    if n == 0 || per == 0 {
        return Err(Error::input("no images").with_file(path));
    }
    if n > MAX_IMAGES || n.saturating_mul(per) > MAX_VALUES {
        return Err(Error::input(format!(
            "{n} images of {}×{}×{} exceed the limit ({MAX_IMAGES} images, {MAX_VALUES} values)",
            shape[0], shape[1], shape[2]
        ))
        .with_file(path));
    }
    crate::limits::check(
        "images (pixel values)",
        n as f64 * per as f64,
        crate::limits::IMAGE_VALUE,
    )
    .map_err(|e| e.with_file(path))?;
    Ok(())
}

impl ImageSet {
    /// Loads MNIST records (`*.u8.gz`), a `.npy` array or a folder of PNG images.
    pub fn load(path: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::load_png_dir(path);
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".npy") {
            Self::load_npy(path)
        } else if name.ends_with(".u8.gz") || name.ends_with(".u8") {
            Self::load_mnist(path)
        } else {
            Err(Error::input(
                "unknown image data format (expected MNIST records *.u8.gz, a .npy array (N, C, H, W) or a folder of PNG files)",
            )
            .with_file(path))
        }
    }

    /// MNIST records: a label byte then 28×28 pixel bytes each (optionally gzip-compressed).
    pub fn load_mnist(path: &Path) -> Result<Self> {
        let raw = crate::limits::read_file_capped(path, "file size", crate::limits::BINARY_INPUT_BYTE)?;
        let sha256 = sha256_hex(&raw);
        let bytes = if path.extension().is_some_and(|e| e == "gz") {
            // The gzip trailer's ISIZE (the decompressed size mod 2^32) sizes the buffer once,
            // capped by the read limit and by deflate's largest ratio (1032:1), so a forged
            // trailer cannot reserve more than the stream could hold; it is a hint only (the
            // stream decides the length).
            let hint = raw.len().checked_sub(4).map_or(0, |i| {
                u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]) as u64
            });
            let hint = hint.min((raw.len() as u64).saturating_mul(1032));
            // The decompressed stream is counted as it is read and cut off at the most records
            // the caps allow (the image-set limit, `IMAGE_VALUE` per pixel value): a gzip bomb
            // is refused having held at most that much, never its whole inflated size (before,
            // a bomb was read up to 785 MB whatever the memory cap, and refused after).
            let rec = (1 + MNIST_SIDE * MNIST_SIDE) as u64;
            let per = (MNIST_SIDE * MNIST_SIDE) as f64;
            let by_caps = (crate::limits::memory_cap()? / crate::limits::IMAGE_VALUE.bytes)
                .min(crate::limits::work_cap()? / crate::limits::IMAGE_VALUE.work)
                / per;
            let max_records = (by_caps.floor() as u64).min(MAX_IMAGES as u64);
            let max_bytes = max_records * rec;
            let read = crate::limits::read_at_most(flate2::read::GzDecoder::new(&raw[..]), max_bytes, hint)
                .map_err(|e| Error::input(format!("not gzip-compressed: {e}")).with_file(path))?;
            read.ok_or_else(|| {
                Error::field(
                    "images (pixel values)",
                    format!(
                        "more than {max_bytes} bytes once decompressed, i.e. more than {max_records} images of \
                         1×{MNIST_SIDE}×{MNIST_SIDE}: above the limit of {max_records} (read up to the limit \
                         and stopped; raise the caps with DPAUDIT_MAX_MEMORY=<bytes, e.g. 16G>)"
                    ),
                )
                .with_file(path)
            })?
        } else {
            raw
        };
        let rec = 1 + MNIST_SIDE * MNIST_SIDE;
        if bytes.is_empty() || bytes.len() % rec != 0 {
            return Err(Error::input(format!(
                "{} bytes is not a whole number of {rec}-byte records (label + 28×28 pixels)",
                bytes.len()
            ))
            .with_file(path));
        }
        let n = bytes.len() / rec;
        check_size(path, n, [1, MNIST_SIDE, MNIST_SIDE])?;
        let mut labels = Vec::with_capacity(n);
        for (i, r) in bytes.chunks_exact(rec).enumerate() {
            if r[0] > 9 {
                return Err(Error::input(format!("record {i}: label {} is not a digit", r[0])).with_file(path));
            }
            labels.push(r[0]);
        }
        Ok(ImageSet {
            path: path.to_path_buf(),
            sha256,
            shape: [1, MNIST_SIDE, MNIST_SIDE],
            pixels: Pixels::Records(bytes),
            labels: Some(labels),
        })
    }

    /// A `.npy` array (N, C, H, W) of float32 (as given) or uint8 (x/127.5 − 1).
    pub fn load_npy(path: &Path) -> Result<Self> {
        // Sizes from the header before any data is read.
        let h = super::npy::read_header(path)?;
        if h.shape.len() == 4 {
            check_size(path, h.shape[0], [h.shape[1], h.shape[2], h.shape[3]])?;
        }
        let raw = crate::limits::read_file_capped(path, "file size", crate::limits::BINARY_INPUT_BYTE)?;
        let sha256 = sha256_hex(&raw);
        let a = super::npy::parse(&raw, path)?;
        if a.shape.len() != 4 {
            return Err(
                Error::input(format!("expected an array of shape (N, C, H, W), got {:?}", a.shape)).with_file(path),
            );
        }
        let shape = [a.shape[1], a.shape[2], a.shape[3]];
        check_size(path, a.shape[0], shape)?;
        let pixels = if let Some(v) = a.to_f32() {
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(Error::input(format!("value {} at flat index {i} is not finite", v[i])).with_file(path));
            }
            v
        } else if let Some(b) = a.as_u8() {
            b.iter().map(|&b| b as f32 / 127.5 - 1.0).collect()
        } else {
            return Err(Error::input(format!(
                "element type {} (expected float32 in the model's range, or uint8 0..255)",
                a.dtype.descr()
            ))
            .with_file(path));
        };
        Ok(ImageSet {
            path: path.to_path_buf(),
            sha256,
            shape,
            pixels: Pixels::F32(pixels),
            labels: None,
        })
    }

    /// Every `*.png` in a folder, in file-name order; all must have the same size and colour type.
    pub fn load_png_dir(dir: &Path) -> Result<Self> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, &e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::input("no .png files in this folder").with_file(dir));
        }
        if files.len() > MAX_IMAGES {
            return Err(Error::input(format!("more than {MAX_IMAGES} images")).with_file(dir));
        }
        let mut hasher = Sha256::new();
        let mut shape: Option<[usize; 3]> = None;
        let mut pixels = Vec::new();
        for f in &files {
            let bytes = crate::limits::read_file_capped(f, "file size", crate::limits::BINARY_INPUT_BYTE)?;
            hasher.update(f.file_name().unwrap().to_string_lossy().as_bytes());
            hasher.update([0u8]);
            hasher.update(&bytes);
            // The header's width × height decides the decoding buffer: capped before it is
            // allocated (a few-KB PNG can declare 10⁵ × 10⁵ pixels).
            let mut limits = png::Limits::default();
            limits.bytes = (crate::limits::memory_cap()? / crate::limits::IMAGE_VALUE.bytes) as usize;
            let mut dec = png::Decoder::new_with_limits(&bytes[..], limits);
            dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
            let mut reader = dec.read_info().map_err(|e| match e {
                png::DecodingError::LimitsExceeded => Error::input(format!(
                    "the PNG header declares an image larger than the limit of {} decoded bytes \
                         (memory cap {}; raise it with {}=<bytes, e.g. 16G>)",
                    limits.bytes,
                    crate::limits::human_bytes(limits.bytes as f64 * crate::limits::IMAGE_VALUE.bytes),
                    crate::limits::MEMORY_ENV
                ))
                .with_file(f),
                e => Error::input(format!("not a PNG image: {e}")).with_file(f),
            })?;
            crate::limits::check(
                "images (pixel values)",
                files.len() as f64 * reader.output_buffer_size() as f64,
                crate::limits::IMAGE_VALUE,
            )
            .map_err(|e| e.with_file(f))?;
            let mut buf = vec![0u8; reader.output_buffer_size()];
            let info = reader
                .next_frame(&mut buf)
                .map_err(|e| Error::input(format!("cannot decode PNG: {e}")).with_file(f))?;
            let (w, h) = (info.width as usize, info.height as usize);
            let (src_ch, keep) = match info.color_type {
                png::ColorType::Grayscale => (1, 1),
                png::ColorType::GrayscaleAlpha => (2, 1),
                png::ColorType::Rgb => (3, 3),
                png::ColorType::Rgba => (4, 3),
                png::ColorType::Indexed => (3, 3),
            };
            let s = [keep, h, w];
            match shape {
                None => {
                    check_size(dir, files.len(), s)?;
                    shape = Some(s);
                    pixels.reserve(files.len() * keep * h * w);
                }
                Some(prev) if prev != s => {
                    return Err(Error::input(format!(
                        "image is {}×{}×{} (C×H×W) but the first image is {}×{}×{}; all images must match",
                        s[0], s[1], s[2], prev[0], prev[1], prev[2]
                    ))
                    .with_file(f))
                }
                _ => {}
            }
            let data = &buf[..info.buffer_size()];
            // Interleaved HWC → planar CHW.
            for c in 0..keep {
                for y in 0..h {
                    for x in 0..w {
                        pixels.push(data[(y * w + x) * src_ch + c] as f32 / 127.5 - 1.0);
                    }
                }
            }
        }
        Ok(ImageSet {
            path: dir.to_path_buf(),
            sha256: hasher.finalize().iter().map(|b| format!("{b:02x}")).collect(),
            shape: shape.unwrap(),
            pixels: Pixels::F32(pixels),
            labels: None,
        })
    }

    /// Values per image.
    pub fn dim(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        match &self.pixels {
            Pixels::F32(v) => v.len() / self.dim(),
            Pixels::Records(b) => b.len() / (1 + self.dim()),
        }
    }

    /// True when there are no images.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The images `ix`, concatenated, in the model's range. Panics if an index is out of range
    /// (splits are checked against the set first: [`ImageSet::check_split`]).
    pub fn rows(&self, ix: &[usize]) -> Vec<f32> {
        let d = self.dim();
        let mut out = Vec::with_capacity(ix.len() * d);
        for &i in ix {
            match &self.pixels {
                Pixels::F32(v) => out.extend_from_slice(&v[i * d..(i + 1) * d]),
                Pixels::Records(b) => {
                    let rec = 1 + d;
                    out.extend(b[i * rec + 1..(i + 1) * rec].iter().map(|&x| x as f32 / 127.5 - 1.0));
                }
            }
        }
        out
    }

    /// A seeded random split: `n_members` members, `n_nonmembers` non-members, the rest public.
    pub fn random_split(
        &self,
        data_name: &str,
        n_members: usize,
        n_nonmembers: usize,
        seed: u64,
    ) -> Result<SplitManifest> {
        SplitManifest::random_rows(self.len(), &self.sha256, data_name, n_members, n_nonmembers, seed)
    }

    /// Checks a split against these images (data hash and index range).
    pub fn check_split(&self, split: &SplitManifest, split_path: &Path) -> Result<()> {
        if split.data_sha256 != self.sha256 {
            return Err(Error::field(
                "data_sha256",
                format!(
                    "split was made for data with SHA-256 {}, but {} has {}",
                    split.data_sha256,
                    self.path.display(),
                    self.sha256
                ),
            )
            .with_file(split_path));
        }
        let n = self.len();
        if let Some(i) = split
            .members
            .iter()
            .chain(&split.nonmembers)
            .chain(&split.public)
            .find(|&&i| i >= n)
        {
            return Err(
                Error::input(format!("row index {i} out of range (data has {n} images)")).with_file(split_path),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_images_load_and_split() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        let vals: Vec<f32> = (0..5 * 2 * 3 * 4).map(|i| i as f32 / 100.0).collect();
        super::super::npy::write_f32(&p, &[5, 2, 3, 4], &vals).unwrap();
        let s = ImageSet::load(&p).unwrap();
        assert_eq!(s.shape, [2, 3, 4]);
        assert_eq!(s.len(), 5);
        assert_eq!(s.rows(&[1]), vals[24..48].to_vec());
        let m = s.random_split("x.npy", 2, 2, 0).unwrap();
        s.check_split(&m, Path::new("s.toml")).unwrap();
        assert_eq!(m.members.len() + m.nonmembers.len() + m.public.len(), 5);
        // A 3-d array is refused with the shape it had.
        super::super::npy::write_f32(&p, &[5, 2, 12], &vals).unwrap();
        let e = ImageSet::load(&p).unwrap_err();
        assert!(e.to_string().contains("(N, C, H, W)"), "{e}");
    }

    #[test]
    fn png_folder_loads_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for (name, v) in [("b.png", 255u8), ("a.png", 0u8)] {
            let f = std::fs::File::create(dir.path().join(name)).unwrap();
            let mut enc = png::Encoder::new(f, 3, 2);
            enc.set_color(png::ColorType::Grayscale);
            enc.set_depth(png::BitDepth::Eight);
            enc.write_header().unwrap().write_image_data(&[v; 6]).unwrap();
        }
        let s = ImageSet::load(dir.path()).unwrap();
        assert_eq!(s.shape, [1, 2, 3]);
        assert_eq!(s.rows(&[0])[0], -1.0);
        assert_eq!(s.rows(&[1])[0], 1.0);
    }
}
