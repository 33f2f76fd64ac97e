//! A small reader and writer for NumPy `.npy` files (format versions 1.0–3.0, C order,
//! little-endian), enough to exchange image batches and timesteps with PyTorch/NumPy code.
//!
//! Supported element types: `<f4`, `<f8`, `<i8`, `<i4`, `|u1`. Reading checks the header, the
//! element type, the shape (≤ 8 dimensions, product within the file's size) and the data length
//! before allocating, so a bad or hostile file is an input error naming the file.

use std::path::Path;

use crate::error::{Error, Result};

/// Element type of an array as stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpyDtype {
    /// `<f4`: little-endian float32.
    F32,
    /// `<f8`: little-endian float64.
    F64,
    /// `<i8`: little-endian int64.
    I64,
    /// `<i4`: little-endian int32.
    I32,
    /// `|u1`: unsigned bytes.
    U8,
}

impl NpyDtype {
    fn parse(descr: &str) -> Option<Self> {
        match descr {
            "<f4" => Some(NpyDtype::F32),
            "<f8" => Some(NpyDtype::F64),
            "<i8" => Some(NpyDtype::I64),
            "<i4" => Some(NpyDtype::I32),
            "|u1" | "<u1" => Some(NpyDtype::U8),
            _ => None,
        }
    }

    /// NumPy's type string (`<f4`, …).
    pub fn descr(self) -> &'static str {
        match self {
            NpyDtype::F32 => "<f4",
            NpyDtype::F64 => "<f8",
            NpyDtype::I64 => "<i8",
            NpyDtype::I32 => "<i4",
            NpyDtype::U8 => "|u1",
        }
    }

    fn size(self) -> usize {
        match self {
            NpyDtype::F32 | NpyDtype::I32 => 4,
            NpyDtype::F64 | NpyDtype::I64 => 8,
            NpyDtype::U8 => 1,
        }
    }
}

/// An array read from a `.npy` file: its shape, stored type and raw little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    /// Dimensions (C order).
    pub shape: Vec<usize>,
    /// Element type in the file.
    pub dtype: NpyDtype,
    data: Vec<u8>,
}

impl NpyArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 (only from `<f4`; other types are refused so that no silent cast
    /// hides a wrong input).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == NpyDtype::F32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        })
    }

    /// The values as i64 (from `<i8` or `<i4`).
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        match self.dtype {
            NpyDtype::I64 => Some(
                self.data
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            ),
            NpyDtype::I32 => Some(
                self.data
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64)
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The raw bytes of `|u1` arrays.
    pub fn as_u8(&self) -> Option<&[u8]> {
        (self.dtype == NpyDtype::U8).then_some(&self.data[..])
    }
}

const MAGIC: &[u8] = b"\x93NUMPY";

fn header_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("'{key}':");
    let start = header.find(&pat)? + pat.len();
    Some(header[start..].trim_start())
}

/// What a `.npy` header declares: enough to check sizes before the data is read.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyHeader {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: NpyDtype,
    /// Where the data starts.
    pub data_start: usize,
    /// The data's length in bytes (shape × element size).
    pub data_len: usize,
}

/// The largest header a `.npy` file may declare (numpy writes under 1 KiB).
const MAX_HEADER: usize = 1 << 20;

/// Reads only the header of the `.npy` file `path` (at most [`MAX_HEADER`] bytes), and checks
/// that the file's size is the header's plus the data its shape declares: sizes are checked from
/// the header before any data is read.
pub fn read_header(path: &Path) -> Result<NpyHeader> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let size = f.metadata().map_err(|e| Error::io(path, &e))?.len();
    let mut head = Vec::new();
    f.take(12 + MAX_HEADER as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, &e))?;
    let h = match parse_header(&head, path) {
        Ok(h) => h,
        Err(e) => {
            // Not a .npy header: a file too large to read whole is refused for its size first
            // (as every binary input is), else for its header.
            crate::limits::check("file size", size as f64, crate::limits::BINARY_INPUT_BYTE)
                .map_err(|e| e.with_file(path))?;
            return Err(e);
        }
    };
    let want = (h.data_start as u64).saturating_add(h.data_len as u64);
    if size != want {
        return Err(Error::input(format!(
            "not a supported .npy file: shape {:?} of {} needs {} data bytes, the file has {}",
            h.shape,
            h.dtype.descr(),
            h.data_len,
            size.saturating_sub(h.data_start as u64)
        ))
        .with_file(path));
    }
    Ok(h)
}

/// Parses the header at the start of `bytes` (the whole file, or only its first bytes).
fn parse_header(bytes: &[u8], path: &Path) -> Result<NpyHeader> {
    let bad = |m: String| Error::input(format!("not a supported .npy file: {m}")).with_file(path);
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("missing the \\x93NUMPY magic".into()));
    }
    let major = bytes[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header".into()));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(bad(format!("format version {v} (this reader knows 1, 2 and 3)"))),
    };
    if hlen > MAX_HEADER {
        return Err(bad(format!("header of {hlen} bytes (at most {MAX_HEADER})")));
    }
    let hend = hstart
        .checked_add(hlen)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("header longer than the file".into()))?;
    let header = std::str::from_utf8(&bytes[hstart..hend]).map_err(|_| bad("header is not text".into()))?;
    let descr = header_value(header, "descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| bad("header has no 'descr'".into()))?;
    let dtype = NpyDtype::parse(descr).ok_or_else(|| {
        bad(format!(
            "element type '{descr}' (supported: <f4 float32, <f8 float64, <i8 int64, <i4 int32, |u1 uint8; little-endian)"
        ))
    })?;
    let fortran = header_value(header, "fortran_order").ok_or_else(|| bad("header has no 'fortran_order'".into()))?;
    if fortran.starts_with("True") {
        return Err(bad(
            "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)".into(),
        ));
    }
    let shape_s = header_value(header, "shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("header has no 'shape'".into()))?;
    let mut shape = Vec::new();
    for part in shape_s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let d: usize = part
            .parse()
            .map_err(|_| bad(format!("shape entry `{part}` is not a size")))?;
        shape.push(d);
    }
    if shape.len() > 8 {
        return Err(bad(format!("{} dimensions (at most 8)", shape.len())));
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| bad("shape overflows".into()))?;
    Ok(NpyHeader {
        shape,
        dtype,
        data_start: hend,
        data_len: n,
    })
}

/// Parses `.npy` bytes; `path` only names the file in errors.
pub fn parse(bytes: &[u8], path: &Path) -> Result<NpyArray> {
    let bad = |m: String| Error::input(format!("not a supported .npy file: {m}")).with_file(path);
    let NpyHeader {
        shape,
        dtype,
        data_start: hend,
        data_len: n,
    } = parse_header(bytes, path)?;
    let body = &bytes[hend..];
    if body.len() != n {
        return Err(bad(format!(
            "shape {:?} of {} needs {n} data bytes, the file has {}",
            shape,
            dtype.descr(),
            body.len()
        )));
    }
    Ok(NpyArray {
        shape,
        dtype,
        data: body.to_vec(),
    })
}

/// Reads a `.npy` file.
pub fn read(path: &Path) -> Result<NpyArray> {
    read_header(path)?;
    let bytes = crate::limits::read_file_capped(path, "file size", crate::limits::BINARY_INPUT_BYTE)?;
    parse(&bytes, path)
}

fn encode(shape: &[usize], dtype: NpyDtype, data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_s = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_s}, }}",
        dtype.descr()
    );
    // Pad so that the data starts on a 64-byte boundary; the header ends with '\n'.
    let total = 10 + header.len() + 1;
    let pad = (64 - total % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// `.npy` bytes of a float32 array of `shape`.
pub fn encode_f32(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    encode(shape, NpyDtype::F32, &data)
}

/// `.npy` bytes of an int64 array of `shape`.
pub fn encode_i64(shape: &[usize], values: &[i64]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    encode(shape, NpyDtype::I64, &data)
}

/// Writes a float32 array.
pub fn write_f32(path: &Path, shape: &[usize], values: &[f32]) -> Result<()> {
    std::fs::write(path, encode_f32(shape, values)).map_err(|e| Error::io(path, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_f32_and_i64() {
        let p = Path::new("x.npy");
        let a = parse(&encode_f32(&[2, 1, 3], &[1.0, -2.5, 3.0, 0.0, 1e-8, 7.0]), p).unwrap();
        assert_eq!(a.shape, vec![2, 1, 3]);
        assert_eq!(a.to_f32().unwrap(), vec![1.0, -2.5, 3.0, 0.0, 1e-8, 7.0]);
        assert!(a.to_i64().is_none());
        let b = parse(&encode_i64(&[3], &[0, 999, -1]), p).unwrap();
        assert_eq!(b.shape, vec![3]);
        assert_eq!(b.to_i64().unwrap(), vec![0, 999, -1]);
        // Magic, length and header padded to a multiple of 64 bytes as NumPy does: this header
        // (58 characters) needs two blocks.
        assert_eq!(encode_i64(&[3], &[0, 1, 2]).len() - 24, 128);
    }

    #[test]
    fn parses_numpy_written_header() {
        // The exact header numpy 1.x/2.x writes for np.zeros((2,), np.int64).
        let mut bytes = b"\x93NUMPY\x01\x00v\x00".to_vec();
        let mut h = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }".to_string();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        bytes.extend_from_slice(h.as_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        let a = parse(&bytes, Path::new("z.npy")).unwrap();
        assert_eq!(a.to_i64().unwrap(), vec![0, 0]);
    }

    #[test]
    fn rejects_bad_files() {
        let p = Path::new("bad.npy");
        assert!(parse(b"hello", p).is_err());
        let mut short = encode_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
        short.truncate(short.len() - 4);
        let e = parse(&short, p).unwrap_err();
        assert!(e.to_string().contains("needs 16 data bytes"), "{e}");
        let mut be = encode_f32(&[1], &[1.0]);
        let at = be.windows(3).position(|w| w == b"<f4").unwrap();
        be[at] = b'>';
        let e = parse(&be, p).unwrap_err();
        assert!(e.to_string().contains("'>f4'"), "{e}");
    }
}
