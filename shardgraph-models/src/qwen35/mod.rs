//! The Qwen3.5-family hybrid target (llama.cpp's `LLM_ARCH_QWEN35`,
//! shardgraph-models/MODELS.md, section 3): every `full_attention_interval`-th
//! layer is a gated full-attention layer (Q and a sigmoid gate interleaved per
//! head, IMROPE over a partial rotary dimension), the others are Gated-DeltaNet
//! layers (fused qkv projection, depthwise causal conv over a conv-state cache,
//! L2-normed q/k, `gated_delta_net` over a recurrent state cache, a norm gated
//! by SiLU(z)). Norm weights are stored +1-shifted by llama.cpp's
//! converter, so the graph multiplies by them directly.
//!
//! One sequence: the recurrent caches hold one state each
//! (`cache_r_lN` `[(d_conv − 1)·conv_channels, 1]`, `cache_s_lN`
//! `[S_v·S_v·H_v, 1]`, F32), the attention layers' KV caches are
//! `[Hkv·D, kv_size]` as in `qwen3`.
//!
//! The module's files: `hparams.rs` (hyper-parameters),
//! `graph.rs` (the model's tensors and a step's graph), `mtp.rs` (the NextN
//! head's step and chain graphs), `session.rs` (decoding one sequence:
//! [`Qwen35Session`], with its MTP step and chain), `policy.rs`
//! ([`qwen35_policy`]). Everything public is named from here
//! (`qwen35::Qwen35Session`, ...).

mod graph;
mod hparams;
mod mtp;
mod policy;
mod session;

pub use graph::{qwen35_tensors, Qwen35, Qwen35Layer, Qwen35Mixer, Qwen35Nextn, Qwen35Step};
pub use hparams::Qwen35Hparams;
pub use mtp::{MtpChain, MtpChainStep, MtpStep};
pub(crate) use policy::qwen35_rules;
pub use policy::{delta_net_rules, qwen35_policy, DeltaNetHeads};
pub use session::{MtpOutput, Qwen35Session};
