//! The library's choice enums as command-line values: each mirror derives `clap::ValueEnum`
//! (the library does not know clap) and converts into the domain enum at the CLI edge.

/// Declares a `clap::ValueEnum` mirror of a domain enum with the same variants (and help) and a
/// conversion into it.
macro_rules! value_enum {
    ($(#[$m:meta])* $name:ident => $domain:path { $($(#[$vm:meta])* $v:ident),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        pub enum $name {
            $($(#[$vm])* $v,)+
        }

        impl From<$name> for $domain {
            fn from(v: $name) -> Self {
                match v {
                    $($name::$v => <$domain>::$v,)+
                }
            }
        }
    };
}

value_enum! {
    /// A deliberate implementation bug, for showing that the audits catch it.
    Fault => dpaudit::pipelines::mechanisms::Fault {
        /// The correct mechanism.
        None,
        /// Averages the raw embeddings: the sensitivity is 2·max‖u‖/m, not 2/m.
        SkipNormalisation,
        /// Noise for a centroid over n while only m are averaged (σ too small by n/m).
        NoiseForFullN,
    }
}

value_enum! {
    /// How per-sample gradients are computed.
    PerSample => dpaudit::models::train::PerSample {
        /// One backward pass with per-sample norms from layer activations (MLP), else the loop.
        Auto,
        /// One backward pass (MLP only).
        Ghost,
        /// One backward pass per sample (any architecture; the reference).
        Loop,
    }
}

value_enum! {
    /// Which part of a split a command works on.
    Part => dpaudit::data::digits::Part {
        /// The rows the model is trained on.
        Members,
        /// Held-out rows from the same distribution.
        Nonmembers,
        /// Public rows (pretraining, RAPID's knowledge base).
        Public,
    }
}

value_enum! {
    /// Network architecture.
    Arch => dpaudit::models::toy::Arch {
        /// MLP with sinusoidal time embedding (supports one-pass per-sample gradients).
        Mlp,
        /// A small UNet (two resolutions, residual blocks, group norm).
        Unet,
    }
}

value_enum! {
    /// The `--device` flag.
    DeviceChoice => dpaudit::models::DeviceChoice {
        /// CUDA when built with it and a GPU is present, else CPU.
        Auto,
        /// The CPU.
        Cpu,
        /// GPU 0 (needs the `cuda` feature).
        Cuda,
    }
}

value_enum! {
    /// Which attack.
    AttackKind => dpaudit::attacks::mia::AttackKind {
        /// Denoising loss at step t.
        Loss,
        /// SecMI's t-error.
        Secmi,
        /// PIA's proximal-initialisation distance.
        Pia,
        /// The loss attack on the empirical denoiser (the sampler's denoiser).
        Empirical,
    }
}

value_enum! {
    /// Which audit with a valid ε lower bound to run.
    AuditKind => dpaudit::attacks::pipeline::AuditKind {
        /// Steinke, Nasr & Jagielski 2023: the canaries of one training run (`train --canaries m`).
        OneRun,
        /// Independent trials (one model per trial, e.g. K trainings with a target record in or
        /// out), from a scores file: held-out threshold, Clopper–Pearson.
        ManyRuns,
    }
}

value_enum! {
    /// `--precision` of the UNet forward on a GPU.
    Precision => dpaudit::models::precision::Precision {
        /// IEEE f32 in every product (no TF32 in cuDNN or cuBLAS).
        Fp32,
        /// TF32 tensor-core convolutions and matrix products, f32 accumulation (GPU only).
        Tf32,
        /// bfloat16 weights and activations, f32 accumulation (GPU only).
        Bf16,
    }
}
