//! The diffusers `UNet2DModel` as a typed graph, built once from its [`Unet2dConfig`].
//!
//! [`Graph::new`] is the one place that knows how diffusers wires the model (`unets/unet_2d.py`:
//! time embedding, `conv_in`, the down blocks with a skip connection after every ResNet/attention
//! pair and every downsampler, the mid block, the up blocks concatenating one skip before every
//! ResNet block, `conv_norm_out` + SiLU, `conv_out`) and the one producer of diffusers tensor
//! names (`down_blocks.{i}.resnets.{j}.conv1.weight` …). Every executor — candle inference, the
//! CPU forward, the CUDA forward, the candle trainer and the CPU per-sample-gradient pass —
//! walks [`Graph::ops`] in order (the gradient pass backwards as well) and takes each tensor by
//! the name and shape its op carries; [`Graph::params`] lists every tensor in execution order.

use super::config::{Act, Resample, TimeEmbedding, Unet2dConfig};

/// How a tensor is initialised when a model is trained from scratch (PyTorch's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// U(−1/√fan_in, 1/√fan_in): `Linear` and `Conv2d` weights (kaiming_uniform, a = √5) and
    /// biases.
    Uniform(usize),
    /// γ of a group norm.
    Ones,
    /// β of a group norm.
    Zeros,
    /// The fixed (not trained) Gaussian Fourier projection, N(0, 16²)
    /// (`GaussianFourierProjection(scale=16)`).
    FourierFixed,
}

/// One tensor of the model: its diffusers name, shape and initialisation.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The diffusers tensor name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// How it starts in a model trained from scratch.
    pub init: Init,
}

/// A `Conv2d` (k × k, stride, zero padding `pad` on the left/top and `pad_hi` on the
/// right/bottom; diffusers' `Downsample2D` with `padding=0` pads right and bottom by one).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvSpec {
    /// Name prefix (`conv_in`, `down_blocks.0.downsamplers.0.conv`, …).
    pub name: String,
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel side.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Zero padding left and top.
    pub pad: usize,
    /// Zero padding right and bottom.
    pub pad_hi: usize,
}

/// A `Linear` layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearSpec {
    /// Name prefix.
    pub name: String,
    /// Input features.
    pub cin: usize,
    /// Output features.
    pub cout: usize,
}

/// A `GroupNorm` (Wu & He 2018): `groups` groups over `ch` channels, epsilon `eps`.
#[derive(Debug, Clone, PartialEq)]
pub struct NormSpec {
    /// Name prefix.
    pub name: String,
    /// Groups.
    pub groups: usize,
    /// Channels.
    pub ch: usize,
    /// Epsilon.
    pub eps: f64,
}

/// The resampling inside a ResNet block (`ResnetBlock2D(down=True)` / `up=True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updown {
    /// None.
    None,
    /// 2 × 2 average pooling of the input and of the first activation.
    Down,
    /// Nearest × 2 of both.
    Up,
}

/// diffusers `ResnetBlock2D`: norm1 → act → (resample) → conv1 → + time projection (or
/// scale/shift after norm2) → norm2 → act → conv2, plus the (1 × 1 projected) input, ÷
/// `output_scale`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResnetSpec {
    /// Name prefix (`down_blocks.0.resnets.1`, `mid_block.resnets.0`, …).
    pub prefix: String,
    /// First norm (over the input channels).
    pub norm1: NormSpec,
    /// First 3 × 3 convolution.
    pub conv1: ConvSpec,
    /// Projection of the activated time embedding (2·cout with `scale_shift`).
    pub time_emb_proj: LinearSpec,
    /// Second norm.
    pub norm2: NormSpec,
    /// Second 3 × 3 convolution.
    pub conv2: ConvSpec,
    /// 1 × 1 projection of the input when the channel count changes.
    pub shortcut: Option<ConvSpec>,
    /// Activation (of the norms' outputs and of the time embedding).
    pub act: Act,
    /// `scale_shift` time conditioning.
    pub scale_shift: bool,
    /// The output is divided by this.
    pub output_scale: f64,
    /// Resampling inside the block.
    pub updown: Updown,
}

/// diffusers `Attention` as the deprecated attention block builds it: optional group norm,
/// q/k/v projections, softmax(q kᵀ/√d) v per head (Vaswani et al. 2017, Eq. 1), output
/// projection, + residual, ÷ `rescale`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnSpec {
    /// Name prefix (`down_blocks.1.attentions.0`, …).
    pub prefix: String,
    /// Channels.
    pub ch: usize,
    /// Group norm of the input (`None`: none).
    pub norm: Option<NormSpec>,
    /// Query projection.
    pub q: LinearSpec,
    /// Key projection.
    pub k: LinearSpec,
    /// Value projection.
    pub v: LinearSpec,
    /// Output projection.
    pub out: LinearSpec,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// The output is divided by this.
    pub rescale: f64,
}

/// The time embedding: features of t (sinusoidal or Fourier), then linear → SiLU → linear.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeSpec {
    /// The features' kind.
    pub kind: TimeEmbedding,
    /// The fixed Fourier weights (`time_proj.weight`, [c0]) of a Fourier embedding.
    pub fourier: Option<ParamSpec>,
    /// Width of the features.
    pub features: usize,
    /// `time_embedding.linear_1`.
    pub linear_1: LinearSpec,
    /// `time_embedding.linear_2`.
    pub linear_2: LinearSpec,
}

/// One step of the forward pass, in execution order. The current activation flows from op to
/// op; [`Op::SkipPush`] keeps a copy of it and [`Op::SkipPopConcat`] concatenates the last kept
/// one after its channels.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// The time embedding (always the first op; its output conditions every ResNet block).
    Time(TimeSpec),
    /// A convolution of the current activation (`conv_in`, a downsampler, an upsampler after
    /// [`Op::Upsample`], `conv_out`).
    Conv(ConvSpec),
    /// A ResNet block.
    Resnet(Box<ResnetSpec>),
    /// An attention block.
    Attention(Box<AttnSpec>),
    /// Nearest-neighbour × 2 (`Upsample2D` before its convolution).
    Upsample,
    /// Keep the current activation as a skip connection.
    SkipPush,
    /// Concatenate the last kept skip connection after the current activation's channels.
    SkipPopConcat,
    /// Group norm then an activation (`conv_norm_out` + SiLU).
    NormAct(NormSpec, Act),
}

/// The graph of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// The ops in execution order.
    pub ops: Vec<Op>,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Map inputs from [0, 1] to [−1, 1] first.
    pub center_input: bool,
    /// Divide the output by t (diffusers does with a Fourier time embedding).
    pub divide_by_t: bool,
}

fn conv(name: String, cin: usize, cout: usize, k: usize, stride: usize, pad: usize) -> ConvSpec {
    ConvSpec {
        name,
        cin,
        cout,
        k,
        stride,
        pad,
        pad_hi: pad,
    }
}

fn linear(name: String, cin: usize, cout: usize) -> LinearSpec {
    LinearSpec { name, cin, cout }
}

impl ConvSpec {
    /// The weight's name.
    pub fn weight(&self) -> String {
        format!("{}.weight", self.name)
    }
    /// The bias's name.
    pub fn bias(&self) -> String {
        format!("{}.bias", self.name)
    }
    /// The weight's shape [cout, cin, k, k].
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.cout, self.cin, self.k, self.k]
    }
    /// Output size of an h × w input.
    pub fn out_hw(&self, h: usize, w: usize) -> (usize, usize) {
        (
            (h + self.pad + self.pad_hi - self.k) / self.stride + 1,
            (w + self.pad + self.pad_hi - self.k) / self.stride + 1,
        )
    }
    fn params(&self, out: &mut Vec<ParamSpec>) {
        let fan = self.cin * self.k * self.k;
        out.push(ParamSpec {
            name: self.weight(),
            shape: self.weight_shape().to_vec(),
            init: Init::Uniform(fan),
        });
        out.push(ParamSpec {
            name: self.bias(),
            shape: vec![self.cout],
            init: Init::Uniform(fan),
        });
    }
}

impl LinearSpec {
    /// The weight's name.
    pub fn weight(&self) -> String {
        format!("{}.weight", self.name)
    }
    /// The bias's name.
    pub fn bias(&self) -> String {
        format!("{}.bias", self.name)
    }
    fn params(&self, out: &mut Vec<ParamSpec>) {
        out.push(ParamSpec {
            name: self.weight(),
            shape: vec![self.cout, self.cin],
            init: Init::Uniform(self.cin),
        });
        out.push(ParamSpec {
            name: self.bias(),
            shape: vec![self.cout],
            init: Init::Uniform(self.cin),
        });
    }
}

impl NormSpec {
    /// γ's name.
    pub fn weight(&self) -> String {
        format!("{}.weight", self.name)
    }
    /// β's name.
    pub fn bias(&self) -> String {
        format!("{}.bias", self.name)
    }
    fn params(&self, out: &mut Vec<ParamSpec>) {
        out.push(ParamSpec {
            name: self.weight(),
            shape: vec![self.ch],
            init: Init::Ones,
        });
        out.push(ParamSpec {
            name: self.bias(),
            shape: vec![self.ch],
            init: Init::Zeros,
        });
    }
}

impl ResnetSpec {
    fn new(prefix: String, cin: usize, cout: usize, c: &Unet2dConfig, output_scale: f64, updown: Updown) -> Self {
        let temb = 4 * c.block_out_channels[0];
        let norm = |n: &str, ch: usize| NormSpec {
            name: format!("{prefix}.{n}"),
            groups: c.norm_num_groups,
            ch,
            eps: c.norm_eps,
        };
        ResnetSpec {
            norm1: norm("norm1", cin),
            conv1: conv(format!("{prefix}.conv1"), cin, cout, 3, 1, 1),
            time_emb_proj: linear(
                format!("{prefix}.time_emb_proj"),
                temb,
                if c.scale_shift { 2 * cout } else { cout },
            ),
            norm2: norm("norm2", cout),
            conv2: conv(format!("{prefix}.conv2"), cout, cout, 3, 1, 1),
            shortcut: (cin != cout).then(|| conv(format!("{prefix}.conv_shortcut"), cin, cout, 1, 1, 0)),
            act: c.act,
            scale_shift: c.scale_shift,
            output_scale,
            updown,
            prefix,
        }
    }

    /// Input channels.
    pub fn cin(&self) -> usize {
        self.conv1.cin
    }

    /// Output channels.
    pub fn cout(&self) -> usize {
        self.conv1.cout
    }

    /// The tensors in the order the forward uses them (the trainers' parameter order).
    fn params(&self, out: &mut Vec<ParamSpec>) {
        self.norm1.params(out);
        self.conv1.params(out);
        self.time_emb_proj.params(out);
        self.norm2.params(out);
        self.conv2.params(out);
        if let Some(s) = &self.shortcut {
            s.params(out);
        }
    }
}

impl AttnSpec {
    fn new(prefix: String, ch: usize, c: &Unet2dConfig, groups: Option<usize>, rescale: f64) -> Self {
        let head_dim = c.attention_head_dim.unwrap_or(ch);
        let heads = (ch / head_dim.max(1)).max(1);
        let inner = heads * head_dim;
        AttnSpec {
            ch,
            norm: groups.map(|g| NormSpec {
                name: format!("{prefix}.group_norm"),
                groups: g,
                ch,
                eps: c.norm_eps,
            }),
            q: linear(format!("{prefix}.to_q"), ch, inner),
            k: linear(format!("{prefix}.to_k"), ch, inner),
            v: linear(format!("{prefix}.to_v"), ch, inner),
            out: linear(format!("{prefix}.to_out.0"), inner, ch),
            heads,
            head_dim,
            rescale,
            prefix,
        }
    }

    fn params(&self, out: &mut Vec<ParamSpec>) {
        if let Some(n) = &self.norm {
            n.params(out);
        }
        for l in [&self.q, &self.k, &self.v, &self.out] {
            l.params(out);
        }
    }
}

/// The current name of an attention projection saved under diffusers' old names
/// (`query`/`key`/`value`/`proj_attn`, renamed by diffusers on load); other names unchanged.
pub fn current_name(name: &str) -> String {
    name.replace(".query.", ".to_q.")
        .replace(".key.", ".to_k.")
        .replace(".value.", ".to_v.")
        .replace(".proj_attn.", ".to_out.0.")
}

impl Graph {
    /// The graph of `c` (`unets/unet_2d.py`'s `UNet2DModel.__init__` and `forward`).
    pub fn new(c: &Unet2dConfig) -> Graph {
        let c0 = c.block_out_channels[0];
        let temb = 4 * c0;
        let n = c.block_out_channels.len();
        let (fourier, features) = match c.time_embedding {
            TimeEmbedding::Positional { .. } => (None, c0),
            TimeEmbedding::Fourier => (
                Some(ParamSpec {
                    name: "time_proj.weight".into(),
                    shape: vec![c0],
                    init: Init::FourierFixed,
                }),
                2 * c0,
            ),
        };
        let mut ops = vec![
            Op::Time(TimeSpec {
                kind: c.time_embedding,
                fourier,
                features,
                linear_1: linear("time_embedding.linear_1".into(), features, temb),
                linear_2: linear("time_embedding.linear_2".into(), temb, temb),
            }),
            Op::Conv(conv("conv_in".into(), c.in_channels, c0, 3, 1, 1)),
            Op::SkipPush,
        ];
        let resnet =
            |p: String, cin, cout, scale, ud| Op::Resnet(Box::new(ResnetSpec::new(p, cin, cout, c, scale, ud)));
        let attn = |p: String, ch, groups, scale| Op::Attention(Box::new(AttnSpec::new(p, ch, c, groups, scale)));
        let mut out_ch = c0;
        for (i, ty) in c.down_block_types.iter().enumerate() {
            let in_ch = out_ch;
            out_ch = c.block_out_channels[i];
            let with_attn = ty == "AttnDownBlock2D";
            let p = format!("down_blocks.{i}");
            for j in 0..c.layers_per_block {
                let cin = if j == 0 { in_ch } else { out_ch };
                ops.push(resnet(format!("{p}.resnets.{j}"), cin, out_ch, 1.0, Updown::None));
                if with_attn {
                    ops.push(attn(
                        format!("{p}.attentions.{j}"),
                        out_ch,
                        Some(c.norm_num_groups),
                        1.0,
                    ));
                }
                ops.push(Op::SkipPush);
            }
            if i + 1 < n {
                let dp = format!("{p}.downsamplers.0");
                if with_attn && c.downsample_type == Resample::Resnet {
                    ops.push(resnet(dp, out_ch, out_ch, 1.0, Updown::Down));
                } else {
                    let pad = c.downsample_padding;
                    let mut cv = conv(format!("{dp}.conv"), out_ch, out_ch, 3, 2, pad);
                    if pad == 0 {
                        cv.pad_hi = 1;
                    }
                    ops.push(Op::Conv(cv));
                }
                ops.push(Op::SkipPush);
            }
        }
        let last = c.block_out_channels[n - 1];
        if c.mid_block {
            let s = c.mid_block_scale_factor;
            ops.push(resnet("mid_block.resnets.0".into(), last, last, s, Updown::None));
            if c.add_attention {
                ops.push(attn("mid_block.attentions.0".into(), last, c.mid_attn_groups(), s));
            }
            ops.push(resnet("mid_block.resnets.1".into(), last, last, s, Updown::None));
        }
        let rev: Vec<usize> = c.block_out_channels.iter().rev().copied().collect();
        let mut out_ch = rev[0];
        for (i, ty) in c.up_block_types.iter().enumerate() {
            let prev = out_ch;
            out_ch = rev[i];
            let in_ch = rev[(i + 1).min(n - 1)];
            let with_attn = ty == "AttnUpBlock2D";
            let p = format!("up_blocks.{i}");
            let layers = c.layers_per_block + 1;
            for j in 0..layers {
                let skip = if j == layers - 1 { in_ch } else { out_ch };
                let rin = if j == 0 { prev } else { out_ch };
                ops.push(Op::SkipPopConcat);
                ops.push(resnet(
                    format!("{p}.resnets.{j}"),
                    rin + skip,
                    out_ch,
                    1.0,
                    Updown::None,
                ));
                if with_attn {
                    ops.push(attn(
                        format!("{p}.attentions.{j}"),
                        out_ch,
                        Some(c.norm_num_groups),
                        1.0,
                    ));
                }
            }
            if i + 1 < n {
                let upp = format!("{p}.upsamplers.0");
                if with_attn && c.upsample_type == Resample::Resnet {
                    ops.push(resnet(upp, out_ch, out_ch, 1.0, Updown::Up));
                } else {
                    ops.push(Op::Upsample);
                    ops.push(Op::Conv(conv(format!("{upp}.conv"), out_ch, out_ch, 3, 1, 1)));
                }
            }
        }
        ops.push(Op::NormAct(
            NormSpec {
                name: "conv_norm_out".into(),
                groups: c.norm_num_groups,
                ch: c0,
                eps: c.norm_eps,
            },
            Act::Silu,
        ));
        ops.push(Op::Conv(conv("conv_out".into(), c0, c.out_channels, 3, 1, 1)));
        Graph {
            ops,
            in_channels: c.in_channels,
            out_channels: c.out_channels,
            center_input: c.center_input_sample,
            divide_by_t: matches!(c.time_embedding, TimeEmbedding::Fourier),
        }
    }

    /// Every tensor of the model in execution order (the fixed Fourier weights first when there
    /// are any): the order the trainers create their parameters in.
    pub fn params(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        for op in &self.ops {
            match op {
                Op::Time(t) => {
                    out.extend(t.fourier.clone());
                    t.linear_1.params(&mut out);
                    t.linear_2.params(&mut out);
                }
                Op::Conv(c) => c.params(&mut out),
                Op::Resnet(r) => r.params(&mut out),
                Op::Attention(a) => a.params(&mut out),
                Op::NormAct(n, _) => n.params(&mut out),
                Op::Upsample | Op::SkipPush | Op::SkipPopConcat => {}
            }
        }
        out
    }

    /// The time embedding op.
    pub fn time(&self) -> &TimeSpec {
        match self.ops.first() {
            Some(Op::Time(t)) => t,
            _ => unreachable!("Graph::new puts the time embedding first"),
        }
    }

    /// Whether every kept skip connection is used exactly once, with the channel counts the
    /// ResNet blocks after each concatenation expect (true for every config [`Graph::new`]
    /// builds; checked by the tests on every fixture and preset).
    pub fn skips_balance(&self) -> bool {
        let mut stack = Vec::new();
        let mut ch = self.in_channels;
        let mut pending: Option<usize> = None;
        for op in &self.ops {
            match op {
                Op::Time(_) | Op::Upsample | Op::NormAct(..) => {}
                Op::Conv(c) => {
                    if c.cin != ch {
                        return false;
                    }
                    ch = c.cout;
                }
                Op::SkipPush => stack.push(ch),
                Op::SkipPopConcat => match stack.pop() {
                    Some(s) => pending = Some(ch + s),
                    None => return false,
                },
                Op::Resnet(r) => {
                    if pending.take().unwrap_or(ch) != r.cin() {
                        return false;
                    }
                    ch = r.cout();
                }
                Op::Attention(a) => {
                    if a.ch != ch {
                        return false;
                    }
                }
            }
            if pending.is_some() && !matches!(op, Op::SkipPopConcat) {
                return false;
            }
        }
        stack.is_empty() && ch == self.out_channels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(json: &str) -> Unet2dConfig {
        Unet2dConfig::parse(json, std::path::Path::new("config.json")).unwrap()
    }

    /// The graph's skips balance and every tensor name is unique, on every preset and a config
    /// with every option (the parameter count from the graph is checked against loaded
    /// checkpoints in `candle`'s tests).
    #[test]
    fn graph_skips_balance_and_names_are_unique() {
        let mut configs: Vec<Unet2dConfig> = crate::models::diffusers_train::PRESETS
            .iter()
            .map(|(_, json, _)| cfg(json))
            .collect();
        configs.push(cfg(
            r#"{"_class_name": "UNet2DModel", "sample_size": 8, "in_channels": 2, "out_channels": 3,
            "block_out_channels": [8, 16, 16], "layers_per_block": 2, "norm_num_groups": 4,
            "down_block_types": ["AttnDownBlock2D", "DownBlock2D", "AttnDownBlock2D"],
            "up_block_types": ["AttnUpBlock2D", "UpBlock2D", "AttnUpBlock2D"],
            "downsample_type": "resnet", "upsample_type": "resnet", "time_embedding_type": "fourier",
            "resnet_time_scale_shift": "scale_shift", "attention_head_dim": 4, "downsample_padding": 0}"#,
        ));
        for c in &configs {
            let g = Graph::new(c);
            assert!(g.skips_balance(), "{}", c.describe());
            let ps = g.params();
            let mut names: Vec<&str> = ps.iter().map(|p| p.name.as_str()).collect();
            names.sort_unstable();
            let before = names.len();
            names.dedup();
            assert_eq!(names.len(), before, "duplicate tensor names");
        }
    }

    /// A graph whose skip connections do not balance is detected (the check can fail).
    #[test]
    fn unbalanced_skips_are_detected() {
        let c = cfg(
            r#"{"_class_name": "UNet2DModel", "sample_size": 8, "in_channels": 1, "out_channels": 1, "block_out_channels": [8, 16],
            "layers_per_block": 1, "norm_num_groups": 4,
            "down_block_types": ["DownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D", "UpBlock2D"]}"#,
        );
        let mut g = Graph::new(&c);
        assert!(g.skips_balance());
        let i = g.ops.iter().position(|o| matches!(o, Op::SkipPopConcat)).unwrap();
        g.ops.remove(i);
        assert!(!g.skips_balance());
    }

    #[test]
    fn old_attention_names_map_to_the_current_ones() {
        assert_eq!(
            current_name("mid_block.attentions.0.proj_attn.weight"),
            "mid_block.attentions.0.to_out.0.weight"
        );
        assert_eq!(
            current_name("down_blocks.1.attentions.0.query.bias"),
            "down_blocks.1.attentions.0.to_q.bias"
        );
        assert_eq!(current_name("conv_in.weight"), "conv_in.weight");
    }
}
