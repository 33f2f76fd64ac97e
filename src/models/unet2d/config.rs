//! The diffusers `UNet2DModel` `config.json`: parsing, defaults and size limits.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// Down-block types this implementation builds.
pub const DOWN_BLOCKS: &[&str] = &["DownBlock2D", "AttnDownBlock2D"];
/// Up-block types this implementation builds.
pub const UP_BLOCKS: &[&str] = &["UpBlock2D", "AttnUpBlock2D"];

/// Time embedding of the timestep before the MLP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TimeEmbedding {
    /// Sinusoidal (`Timesteps`): `flip_sin_to_cos`, `freq_shift` from the config.
    Positional {
        /// Put cos before sin.
        flip_sin_to_cos: bool,
        /// `downscale_freq_shift` of `get_timestep_embedding`.
        freq_shift: f64,
    },
    /// `GaussianFourierProjection` of log t (scale 16, weights in `time_proj.weight`); the output
    /// is divided by t as diffusers does.
    Fourier,
}

/// Activation of the ResNet blocks (`act_fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// SiLU (`silu`, `swish`).
    Silu,
    /// Mish.
    Mish,
    /// GELU (erf form).
    Gelu,
    /// ReLU.
    Relu,
}

/// How a block samples down or up (`downsample_type` / `upsample_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    /// A strided 3×3 convolution (down) or nearest ×2 then a 3×3 convolution (up).
    Conv,
    /// A ResNet block with average pooling (down) or nearest ×2 (up) inside.
    Resnet,
}

/// The parts of a diffusers `UNet2DModel` `config.json` that decide the architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct Unet2dConfig {
    /// Input image channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Nominal image size (informational; any size divisible by 2 per downsampling runs).
    pub sample_size: Option<(usize, usize)>,
    /// Output channels of each down block (reversed for the up blocks).
    pub block_out_channels: Vec<usize>,
    /// Down-block type names.
    pub down_block_types: Vec<String>,
    /// Up-block type names.
    pub up_block_types: Vec<String>,
    /// ResNet blocks per down block (up blocks have one more).
    pub layers_per_block: usize,
    /// Time embedding.
    pub time_embedding: TimeEmbedding,
    /// ResNet activation.
    pub act: Act,
    /// Channels per attention head (`None`: one head).
    pub attention_head_dim: Option<usize>,
    /// Group-norm groups of the ResNet blocks and output norm.
    pub norm_num_groups: usize,
    /// Group-norm groups of the mid-block attention (`None`: see [`Unet2dConfig::mid_attn_groups`]).
    pub attn_norm_num_groups: Option<usize>,
    /// Group-norm epsilon.
    pub norm_eps: f64,
    /// `scale_shift` (true) or `default` (false) time conditioning of the ResNet blocks.
    pub scale_shift: bool,
    /// Mid block with attention.
    pub add_attention: bool,
    /// A mid block at all (`mid_block_type` not null).
    pub mid_block: bool,
    /// Padding of the strided down convolution (0 pads right/bottom by one first).
    pub downsample_padding: usize,
    /// Downsampling of attention down blocks.
    pub downsample_type: Resample,
    /// Upsampling of attention up blocks.
    pub upsample_type: Resample,
    /// Output scale factor of the mid block.
    pub mid_block_scale_factor: f64,
    /// Map inputs from [0, 1] to [−1, 1] first.
    pub center_input_sample: bool,
    /// Keys the file left out, with the diffusers default used for each.
    pub defaulted: Vec<String>,
}

/// The largest `layers_per_block` a config may have: the depth of the graph the forward and
/// backward passes walk grows with it (10⁴ overflowed the stack while the parameter count was
/// still inside its limit); diffusers' own models use 1 to 3.
pub const MAX_LAYERS_PER_BLOCK: usize = 64;
/// The largest number of blocks (`block_out_channels` entries) a config may have.
pub const MAX_BLOCKS: usize = 16;

fn cfg_err(path: &Path, key: &str, msg: impl Into<String>) -> Error {
    Error::field(key, msg).with_file(path)
}

impl Unet2dConfig {
    /// Parses a `config.json` (its text); `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let v: Value = crate::input::parse_python_json(text).map_err(|e| {
            Error::input(format!("not valid JSON: {e}"))
                .with_file(path)
                .with_line(e.line())
        })?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::input("config.json must be a JSON object").with_file(path))?;
        let mut defaulted = Vec::new();
        match obj.get("_class_name").and_then(Value::as_str) {
            Some("UNet2DModel") => {}
            Some(other) => {
                return Err(cfg_err(
                    path,
                    "_class_name",
                    format!("`{other}` is not supported (this dpaudit loads UNet2DModel; see docs/models.md)"),
                ))
            }
            None => return Err(cfg_err(path, "_class_name", "missing (expected \"UNet2DModel\")")),
        }
        let req = |key: &str| -> Result<&Value> {
            obj.get(key)
                .ok_or_else(|| cfg_err(path, key, "missing (a UNet2DModel config must state it)"))
        };
        let uint = |key: &str, v: &Value| -> Result<usize> {
            v.as_u64()
                .filter(|&n| n > 0 && n < 1 << 20)
                .map(|n| n as usize)
                .ok_or_else(|| cfg_err(path, key, format!("expected a positive integer, got {v}")))
        };
        let strings = |key: &str| -> Result<Vec<String>> {
            req(key)?
                .as_array()
                .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect())
                .ok_or_else(|| cfg_err(path, key, "expected a list of block type names"))
        };
        let mut opt = |key: &str, default: &str| -> Option<&Value> {
            let r = obj.get(key);
            if r.is_none() {
                defaulted.push(format!("{key} = {default}"));
            }
            r
        };
        let in_channels = uint("in_channels", req("in_channels")?)?;
        let out_channels = uint("out_channels", req("out_channels")?)?;
        let block_out_channels: Vec<usize> = req("block_out_channels")?
            .as_array()
            .ok_or_else(|| cfg_err(path, "block_out_channels", "expected a list of integers"))?
            .iter()
            .map(|v| uint("block_out_channels", v))
            .collect::<Result<_>>()?;
        let down_block_types = strings("down_block_types")?;
        let up_block_types = strings("up_block_types")?;
        let layers_per_block = uint("layers_per_block", req("layers_per_block")?)?;
        if layers_per_block > MAX_LAYERS_PER_BLOCK {
            return Err(cfg_err(
                path,
                "layers_per_block",
                format!("{layers_per_block} is above the limit of {MAX_LAYERS_PER_BLOCK} (diffusers' own models use 1 to 3)"),
            ));
        }
        if block_out_channels.is_empty() {
            return Err(cfg_err(path, "block_out_channels", "must not be empty"));
        }
        if block_out_channels.len() > MAX_BLOCKS {
            return Err(cfg_err(
                path,
                "block_out_channels",
                format!("{} blocks is above the limit of {MAX_BLOCKS}", block_out_channels.len()),
            ));
        }
        for (key, list) in [
            ("down_block_types", &down_block_types),
            ("up_block_types", &up_block_types),
        ] {
            if list.len() != block_out_channels.len() {
                return Err(cfg_err(
                    path,
                    key,
                    format!(
                        "{} entries, but block_out_channels has {}",
                        list.len(),
                        block_out_channels.len()
                    ),
                ));
            }
        }
        for (i, b) in down_block_types.iter().enumerate() {
            if !DOWN_BLOCKS.contains(&b.as_str()) {
                return Err(cfg_err(
                    path,
                    &format!("down_block_types[{i}]"),
                    format!("unknown block type `{b}` (supported: {})", DOWN_BLOCKS.join(", ")),
                ));
            }
        }
        for (i, b) in up_block_types.iter().enumerate() {
            if !UP_BLOCKS.contains(&b.as_str()) {
                return Err(cfg_err(
                    path,
                    &format!("up_block_types[{i}]"),
                    format!("unknown block type `{b}` (supported: {})", UP_BLOCKS.join(", ")),
                ));
            }
        }
        let sample_size = match obj.get("sample_size") {
            None | Some(Value::Null) => None,
            Some(v) => match (v.as_u64(), v.as_array()) {
                (Some(n), _) => Some((n as usize, n as usize)),
                (None, Some(a)) if a.len() == 2 && a.iter().all(|x| x.as_u64().is_some()) => {
                    Some((a[0].as_u64().unwrap() as usize, a[1].as_u64().unwrap() as usize))
                }
                _ => {
                    return Err(cfg_err(
                        path,
                        "sample_size",
                        format!("expected an integer or [h, w], got {v}"),
                    ))
                }
            },
        };
        let as_bool = |key: &str, v: Option<&Value>, d: bool| -> Result<bool> {
            match v {
                None => Ok(d),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| cfg_err(path, key, format!("expected true or false, got {v}"))),
            }
        };
        let as_f64 = |key: &str, v: Option<&Value>, d: f64| -> Result<f64> {
            match v {
                None => Ok(d),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| cfg_err(path, key, format!("expected a number, got {v}"))),
            }
        };
        let as_str = |key: &str, v: Option<&Value>, d: &'static str| -> Result<String> {
            match v {
                None | Some(Value::Null) if d.is_empty() => Ok(String::new()),
                None => Ok(d.to_string()),
                Some(v) => v
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| cfg_err(path, key, format!("expected a string, got {v}"))),
            }
        };
        let tet = as_str(
            "time_embedding_type",
            opt("time_embedding_type", "\"positional\""),
            "positional",
        )?;
        let flip = as_bool("flip_sin_to_cos", opt("flip_sin_to_cos", "true"), true)?;
        let freq_shift = as_f64("freq_shift", opt("freq_shift", "0"), 0.0)?;
        let time_embedding = match tet.as_str() {
            "positional" => TimeEmbedding::Positional {
                flip_sin_to_cos: flip,
                freq_shift,
            },
            "fourier" => TimeEmbedding::Fourier,
            other => {
                return Err(cfg_err(
                    path,
                    "time_embedding_type",
                    format!("`{other}` is not supported (positional, fourier)"),
                ))
            }
        };
        let act = match as_str("act_fn", opt("act_fn", "\"silu\""), "silu")?.as_str() {
            "silu" | "swish" => Act::Silu,
            "mish" => Act::Mish,
            "gelu" => Act::Gelu,
            "relu" => Act::Relu,
            other => {
                return Err(cfg_err(
                    path,
                    "act_fn",
                    format!("`{other}` is not supported (silu, swish, mish, gelu, relu)"),
                ))
            }
        };
        let attention_head_dim = match opt("attention_head_dim", "8") {
            None => Some(8),
            Some(Value::Null) => None,
            Some(v) => Some(uint("attention_head_dim", v)?),
        };
        let norm_num_groups = match opt("norm_num_groups", "32") {
            None => 32,
            Some(v) => uint("norm_num_groups", v)?,
        };
        let attn_norm_num_groups = match obj.get("attn_norm_num_groups") {
            None | Some(Value::Null) => None,
            Some(v) => Some(uint("attn_norm_num_groups", v)?),
        };
        let norm_eps = as_f64("norm_eps", opt("norm_eps", "1e-5"), 1e-5)?;
        if norm_eps <= 0.0 {
            return Err(cfg_err(path, "norm_eps", format!("must be > 0, got {norm_eps}")));
        }
        let scale_shift = match as_str(
            "resnet_time_scale_shift",
            opt("resnet_time_scale_shift", "\"default\""),
            "default",
        )?
        .as_str()
        {
            "default" => false,
            "scale_shift" => true,
            other => {
                return Err(cfg_err(
                    path,
                    "resnet_time_scale_shift",
                    format!("`{other}` is not supported (default, scale_shift)"),
                ))
            }
        };
        let add_attention = as_bool("add_attention", opt("add_attention", "true"), true)?;
        let mid_block = match obj.get("mid_block_type") {
            None => true,
            Some(Value::Null) => false,
            Some(Value::String(s)) if s == "UNetMidBlock2D" => true,
            Some(v) => {
                return Err(cfg_err(
                    path,
                    "mid_block_type",
                    format!("unknown block type {v} (supported: UNetMidBlock2D or null)"),
                ))
            }
        };
        let downsample_padding = match opt("downsample_padding", "1") {
            None => 1,
            Some(v) => v
                .as_u64()
                .filter(|&n| n <= 2)
                .ok_or_else(|| cfg_err(path, "downsample_padding", format!("expected 0, 1 or 2, got {v}")))?
                as usize,
        };
        let resample = |key: &str| -> Result<Resample> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(Resample::Conv),
                Some(Value::String(s)) if s == "conv" => Ok(Resample::Conv),
                Some(Value::String(s)) if s == "resnet" => Ok(Resample::Resnet),
                Some(v) => Err(cfg_err(path, key, format!("`{v}` is not supported (conv, resnet)"))),
            }
        };
        let downsample_type = resample("downsample_type")?;
        let upsample_type = resample("upsample_type")?;
        let mid_block_scale_factor = as_f64("mid_block_scale_factor", opt("mid_block_scale_factor", "1"), 1.0)?;
        if mid_block_scale_factor <= 0.0 {
            return Err(cfg_err(path, "mid_block_scale_factor", "must be > 0"));
        }
        let center_input_sample = as_bool("center_input_sample", obj.get("center_input_sample"), false)?;
        for key in ["class_embed_type", "num_class_embeds"] {
            if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
                return Err(cfg_err(
                    path,
                    key,
                    format!("class-conditional UNets are not supported (got {v}; expected null)"),
                ));
            }
        }
        let c = Unet2dConfig {
            in_channels,
            out_channels,
            sample_size,
            block_out_channels,
            down_block_types,
            up_block_types,
            layers_per_block,
            time_embedding,
            act,
            attention_head_dim,
            norm_num_groups,
            attn_norm_num_groups,
            norm_eps,
            scale_shift,
            add_attention,
            mid_block,
            downsample_padding,
            downsample_type,
            upsample_type,
            mid_block_scale_factor,
            center_input_sample,
            defaulted,
        };
        for &ch in &c.block_out_channels {
            if ch % c.norm_num_groups != 0 {
                return Err(cfg_err(
                    path,
                    "norm_num_groups",
                    format!(
                        "{} groups do not divide block_out_channels entry {ch}",
                        c.norm_num_groups
                    ),
                ));
            }
        }
        // The model's size from the config, before anything is built or read (a deep or wide
        // config is refused here, not by the allocator or the stack).
        crate::limits::check(
            "parameters (from config.json)",
            c.parameter_count(),
            crate::limits::TRAINED_PARAMETER,
        )
        .map_err(|e| e.with_file(path))?;
        Ok(c)
    }

    /// The number of parameters of the model this config describes, computed from the config
    /// alone (the shapes [`Unet2dModel::new`] takes), in floating point so that no size
    /// overflows: what the size limits check before anything is built or read.
    pub fn parameter_count(&self) -> f64 {
        super::graph::Graph::new(self)
            .params()
            .iter()
            .map(|p| p.shape.iter().map(|&d| d as f64).product::<f64>())
            .sum()
    }

    /// Number of 2× downsamplings (every down block but the last).
    pub fn downsamplings(&self) -> usize {
        self.block_out_channels.len() - 1
    }

    /// Group-norm groups of the mid-block attention (diffusers: `attn_norm_num_groups`, else the
    /// ResNet groups with `default` time conditioning, else no group norm).
    pub fn mid_attn_groups(&self) -> Option<usize> {
        self.attn_norm_num_groups
            .or((!self.scale_shift).then_some(self.norm_num_groups))
    }

    /// Values per image of the forward's buffers on an h×w input, for sizing a GPU batch:
    /// (the largest feature map with its skip concatenated, every skip connection kept for the
    /// up path, the largest attention matrix over all heads).
    pub fn activation_values(&self, h: usize, w: usize) -> (usize, usize, usize) {
        let mut feature = 0;
        let mut skips = self.block_out_channels[0] * h * w;
        let mut attn = 0;
        for (i, &ch) in self.block_out_channels.iter().enumerate() {
            let px = (h >> i).max(1) * (w >> i).max(1);
            feature = feature.max(2 * ch * px);
            skips += (self.layers_per_block + 1) * ch * px;
            let attended = self.down_block_types.get(i).is_some_and(|t| t.starts_with("Attn"))
                || (i + 1 == self.block_out_channels.len() && self.add_attention && self.mid_block);
            if attended {
                let heads = self.attention_head_dim.map_or(1, |d| (ch / d.max(1)).max(1));
                attn = attn.max(heads * px * px);
            }
        }
        (feature, skips, attn)
    }

    /// One-line summary of the architecture.
    pub fn describe(&self) -> String {
        format!(
            "UNet2DModel {}→{} channels, blocks {:?} × {} layers, down {:?}, up {:?}, mid {}, {} time embedding, \
             {} groups (eps {}), head dim {}, {} time conditioning",
            self.in_channels,
            self.out_channels,
            self.block_out_channels,
            self.layers_per_block,
            self.down_block_types,
            self.up_block_types,
            if !self.mid_block {
                "none"
            } else if self.add_attention {
                "with attention"
            } else {
                "without attention"
            },
            match self.time_embedding {
                TimeEmbedding::Positional { .. } => "positional",
                TimeEmbedding::Fourier => "fourier",
            },
            self.norm_num_groups,
            self.norm_eps,
            self.attention_head_dim
                .map(|d| d.to_string())
                .unwrap_or_else(|| "= channels".into()),
            if self.scale_shift { "scale_shift" } else { "default" }
        )
    }
}
