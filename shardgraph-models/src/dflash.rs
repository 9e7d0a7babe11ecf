//! The DFlash block-diffusion drafter (llama.cpp's `LLM_ARCH_DFLASH`,
//! shardgraph-models/MODELS.md, section 4): a small Qwen3-style decoder that
//! drafts a whole block (`[anchor, mask × (B−1)]`) in one non-causal pass,
//! attending to K/V injected from the target's hidden states. It borrows the
//! target's token embedding and output head, so its tensors live in the
//! target's context (named `dft.` + the GGUF name, so the two models' `blk.N.*`
//! never meet).
//!
//! Two graphs: the context-injection graph (target features → `fc` → norm →
//! each layer's K/V written into the drafter's caches at the target
//! positions) and the block graph (the block's own K/V written after the
//! context, attention over context + block, logits for every row).
//! The layers are the shared Qwen3-style decoder layer ([`super::decoder`],
//! with DFlash2's convolutions around its sublayers); DFlash2's candidate
//! selector is here.
//!
//! Also here: [`DflashDrafter`], the drafter in the speculative loop
//! ([`Drafter`]) attached to a target session ([`DraftHost`]), and the
//! split policy of a target with its drafter ([`qwen3_dflash_policy`],
//! [`qwen35_dflash_policy`]: the target's rules plus the drafter's).

use super::decoder::{decoder_layer, kv_rows, new_layer, LayerConv, LayerShape, Qwen3Layer};
use super::hparams::{read_shared, ArchKeys, HparamsCore, Model, DIM};
use super::layers::{self, input, named, rms_norm_w};
use super::policy::{layer_rules, qwen3_layer_granules};
use super::qwen3::{qwen3_policy, qwen3_rules, Qwen3, Qwen3Hparams, Qwen3Session};
use super::qwen35::{qwen35_rules, Qwen35, Qwen35Hparams, Qwen35Session};
use super::runner::Runner;
use super::step::{cell_bytes, check_p_min, f32s, i32_bytes, i32s, mask_bytes, Drafter, StepOutput};
use super::types::{KvTypes, TensorTypes};
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::split::{SplitPolicy, SplitSpec};
use shardgraph::tensor::{GgmlType, TensorId};

/// What a DFlash drafter borrows from and checks against its target.
#[derive(Clone, Copy, Debug)]
pub struct TargetInfo {
    /// The target's hidden size E.
    pub n_embd: i64,
    /// The target's vocabulary V.
    pub n_vocab: i64,
    /// The target's trunk layers (a tap of `n_layer` is the post-final-norm state).
    pub n_layer: usize,
    /// The target's `token_embd.weight` `[E, V]`.
    pub tok_embd: TensorId,
    /// The target's `output.weight` `[E, V]`.
    pub output: TensorId,
}

impl From<&Qwen3> for TargetInfo {
    fn from(t: &Qwen3) -> Self {
        TargetInfo {
            n_embd: t.hp.n_embd,
            n_vocab: t.hp.n_vocab,
            n_layer: t.hp.n_layer,
            tok_embd: t.tok_embd,
            output: t.output,
        }
    }
}

impl From<&Qwen35> for TargetInfo {
    fn from(t: &Qwen35) -> Self {
        TargetInfo {
            n_embd: t.hp.n_embd,
            n_vocab: t.hp.n_vocab,
            n_layer: t.hp.n_layer,
            tok_embd: t.tok_embd,
            output: t.output,
        }
    }
}

/// A target session a DFlash drafter can live in: its context (the drafter's
/// tensors go after the target's), its devices and store, and llama.cpp's
/// split policy for target and drafter together.
pub trait DraftHost {
    /// The borrowed embedding and head, and the sizes to check.
    fn info(&self) -> TargetInfo;
    /// KV cache cells (the drafter's caches get as many).
    fn kv_size(&self) -> i64;
    /// The context, the runner, and the length of the long-lived part.
    fn parts(&mut self) -> (&mut Context, &mut Runner, &mut usize);
    /// The split policy for the target with the drafter `hp` (weights of
    /// the types `types` gives) in its context.
    ///
    /// # Errors
    /// As the target's policy, for either model's heads.
    fn policy_with(&self, hp: &DflashHparams, types: &TensorTypes) -> Result<shardgraph::split::SplitPolicy>;
}

impl DraftHost for Qwen3Session {
    fn info(&self) -> TargetInfo {
        (&self.model).into()
    }
    fn kv_size(&self) -> i64 {
        self.model.kv_size
    }
    fn parts(&mut self) -> (&mut Context, &mut Runner, &mut usize) {
        (&mut self.ctx, &mut self.runner, &mut self.base_len)
    }
    fn policy_with(&self, hp: &DflashHparams, types: &TensorTypes) -> Result<shardgraph::split::SplitPolicy> {
        let ratios = self.runner.policy().ratios().to_vec();
        if let Some(n_layer) = self.runner.policy().layer_split_of() {
            return shardgraph::split::SplitPolicy::layer_split(&ratios, n_layer);
        }
        qwen3_dflash_policy(&self.model.hp, &self.model.types, hp, types, &ratios)
    }
}

impl DraftHost for Qwen35Session {
    fn info(&self) -> TargetInfo {
        (&self.model).into()
    }
    fn kv_size(&self) -> i64 {
        self.model.kv_size
    }
    fn parts(&mut self) -> (&mut Context, &mut Runner, &mut usize) {
        (&mut self.ctx, &mut self.runner, &mut self.base_len)
    }
    fn policy_with(&self, hp: &DflashHparams, types: &TensorTypes) -> Result<shardgraph::split::SplitPolicy> {
        let ratios = self.runner.policy().ratios().to_vec();
        if let Some(n_layer) = self.runner.policy().layer_split_of() {
            return shardgraph::split::SplitPolicy::layer_split(&ratios, n_layer);
        }
        qwen35_dflash_policy(&self.model.hp, &self.model.types, hp, types, &ratios)
    }
}

/// The largest DFlash block (`dflash.block_size`) accepted: a block is one
/// anchor and up to `MAX_BLOCK − 1` drafted tokens verified in one target
/// batch (published drafters use 16).
pub const MAX_BLOCK: usize = 256;

/// Hyper-parameters of a DFlash drafter (GGUF keys `dflash.*`): the shared
/// core ([`HparamsCore`]; `hp.n_embd` reads through to it) and its own.
#[derive(Clone, Debug, PartialEq)]
pub struct DflashHparams {
    /// Drafter layers (`dflash.block_count`, 5 in practice), hidden size E
    /// (`dflash.embedding_length`; equals the target's, since it borrows the
    /// target's embedding and head), FFN size, heads, RMSNorm ε, rope base.
    pub core: HparamsCore,
    /// Tapped target layers as the GGUF stores them (`dflash.target_layers`,
    /// HF ids + 1: the input of layer k+1 is the output of layer k).
    pub target_layers: Vec<usize>,
    /// Target hidden size Et (`dflash.target_hidden_size`).
    pub target_hidden: i64,
    /// Block size B (`dflash.block_size`): anchor + B−1 masks.
    pub block_size: usize,
    /// The mask token (`tokenizer.ggml.mask_token_id`).
    pub mask_token: i32,
    /// DFlash2's convolution: taps and channels per group
    /// (`dflash.conv_kernel_size`, `dflash.conv_group_size`; 2 and 16), or
    /// `None` for DFlash v1.
    pub conv: Option<(i64, i64)>,
    /// DFlash2's candidate selector: low-rank codebook rank R and
    /// candidates per position K (`dflash.selector_rank`,
    /// `dflash.selector_top_k`; 256 and 16), or `None` (DFlash v1: drafts
    /// are the rows' greedy tokens).
    pub selector: Option<(i64, i64)>,
}

impl std::ops::Deref for DflashHparams {
    type Target = HparamsCore;
    fn deref(&self) -> &HparamsCore {
        &self.core
    }
}

impl std::ops::DerefMut for DflashHparams {
    fn deref_mut(&mut self) -> &mut HparamsCore {
        &mut self.core
    }
}

impl DflashHparams {
    /// Checks the drafter against its target: same hidden size and
    /// vocabulary, tapped layers within the target, heads that divide.
    ///
    /// # Errors
    /// [`Error::Model`] naming the mismatch.
    pub fn validate(&self, target: &TargetInfo) -> Result<()> {
        let bad = |d: String| Err(Error::Model { detail: format!("dflash drafter: {d}") });
        if self.n_layer == 0 || self.n_ff <= 0 || self.head_dim <= 0 || self.head_dim % 2 != 0 {
            return bad("block_count, feed_forward_length and an even key_length must be positive".into());
        }
        if self.n_layer > crate::MAX_LAYERS {
            return bad(format!("block_count {} is over {}", self.n_layer, crate::MAX_LAYERS));
        }
        if !self.heads_divide() {
            return bad(format!("head_count {} is not a multiple of head_count_kv {}", self.n_head, self.n_head_kv));
        }
        if self.n_embd != target.n_embd {
            return bad(format!(
                "embedding_length {} differs from the target's {} (it borrows the target's embedding and head)",
                self.n_embd, target.n_embd
            ));
        }
        if self.target_hidden != target.n_embd {
            return bad(format!("target_hidden_size {} but the target's is {}", self.target_hidden, target.n_embd));
        }
        if self.target_layers.is_empty() || self.target_layers.iter().any(|&l| l > target.n_layer) {
            return bad(format!(
                "target_layers {:?} must name layers 0..={} of the target",
                self.target_layers, target.n_layer
            ));
        }
        if !(2..=MAX_BLOCK).contains(&self.block_size) {
            return bad(format!("block_size {} must be 2..={MAX_BLOCK}", self.block_size));
        }
        if !self.eps_and_base_positive() {
            return bad("layer_norm_rms_epsilon and rope.freq_base must be finite and positive".into());
        }
        if let Some((k, g)) = self.conv {
            if k < 1 || g < 1 || self.n_embd % g != 0 {
                return bad(format!(
                    "conv_kernel_size {k} / conv_group_size {g} do not fit embedding_length {}",
                    self.n_embd
                ));
            }
        }
        if let Some((r, k)) = self.selector {
            if r < 1 || k < 1 || k > target.n_vocab || self.n_embd < k + k * k {
                return bad(format!(
                    "selector_rank {r} / selector_top_k {k}: need both ≥ 1, top_k ≤ the vocabulary ({}) and \
                     embedding_length {} ≥ top_k + top_k² (one lattice row per position)",
                    target.n_vocab, self.n_embd
                ));
            }
        }
        if self.mask_token < 0 || self.mask_token as i64 >= target.n_vocab {
            return bad(format!(
                "mask token {} outside the target's vocabulary of {}",
                self.mask_token, target.n_vocab
            ));
        }
        Ok(())
    }

    /// Reads a `dflash` GGUF's metadata (llama.cpp's keys: `dflash.*`,
    /// `tokenizer.ggml.mask_token_id`; `block_size` defaults to 16, the
    /// target hidden size to the drafter's).
    ///
    /// # Errors
    /// [`Error::Model`] for another architecture; [`Error::Gguf`] naming a
    /// missing or mistyped key.
    pub fn from_gguf(f: &shardgraph::gguf::GgufFile) -> Result<Self> {
        Ok(Self::read(f)?.0)
    }

    /// [`DflashHparams::from_gguf`] and the file's `dflash.vocab_size`, if
    /// any (range-checked; the caller compares it with the target's).
    ///
    /// # Errors
    /// As [`DflashHparams::from_gguf`].
    pub(crate) fn read(f: &shardgraph::gguf::GgufFile) -> Result<(Self, Option<i64>)> {
        let k = ArchKeys::new(f, Model::Dflash)?;
        let shared = read_shared(&k)?;
        let key = "dflash.target_layers";
        let layers: Vec<i64> = match f.get_arr_u32(key) {
            Ok(v) => v.into_iter().map(i64::from).collect(),
            Err(_) => f.get_arr_i32(key)?.into_iter().map(i64::from).collect(),
        };
        let max = crate::MAX_LAYERS as i64;
        if layers.is_empty() || layers.len() > crate::MAX_LAYERS || layers.iter().any(|l| !(0..=max).contains(l)) {
            return Err(Error::Model {
                detail: format!(
                    "dflash: {key} needs 1 to {max} layer numbers of 0..={max}, got {} value(s)",
                    layers.len()
                ),
            });
        }
        let pair = |a: &str, b: &str| -> Result<Option<(i64, i64)>> {
            match (k.opt_int(a, DIM)?, k.opt_int(b, DIM)?) {
                (Some(x), Some(y)) => Ok(Some((x, y))),
                (None, None) => Ok(None),
                _ => Err(Error::Model { detail: format!("dflash: dflash.{a} and dflash.{b} come together") }),
            }
        };
        let hp = DflashHparams {
            target_layers: layers.into_iter().map(|l| l as usize).collect(),
            target_hidden: k.int_or("target_hidden_size", shared.core.n_embd, DIM)?,
            block_size: k.int_or("block_size", 16, 2..=MAX_BLOCK as i64)? as usize,
            mask_token: k.int_at("tokenizer.ggml.mask_token_id", 0..=i32::MAX as i64)? as i32,
            conv: pair("conv_kernel_size", "conv_group_size")?,
            selector: pair("selector_rank", "selector_top_k")?,
            core: shared.core,
        };
        Ok((hp, shared.vocab_size))
    }

    /// Writes llama.cpp's `dflash` metadata for these hyper-parameters and
    /// a minimal vocabulary of `n_vocab` tokens
    /// ([`crate::hparams::add_vocabulary`]): llama.cpp reads
    /// `tokenizer.ggml.mask_token_id` only from a file with a vocabulary.
    ///
    /// # Errors
    /// [`Error::Model`] for `n_vocab` outside 1 to 2³¹ − 1; [`Error::Gguf`]
    /// from the writer.
    pub fn add_to_gguf(&self, w: &mut shardgraph::gguf::GgufWriter, name: &str, n_vocab: i64) -> Result<()> {
        w.add_kv("general.architecture", "dflash")?;
        w.add_kv("general.name", name)?;
        self.core.add_to_gguf(w, "dflash", 4096)?;
        w.add_kv("dflash.target_layers", self.target_layers.iter().map(|&l| l as u32).collect::<Vec<u32>>())?;
        w.add_kv("dflash.target_hidden_size", self.target_hidden as u32)?;
        w.add_kv("dflash.block_size", self.block_size as u32)?;
        w.add_kv("dflash.vocab_size", n_vocab as u32)?;
        crate::hparams::add_vocabulary(w, n_vocab)?;
        w.add_kv("tokenizer.ggml.mask_token_id", self.mask_token as u32)?;
        if let Some((k, g)) = self.conv {
            w.add_kv("dflash.conv_kernel_size", k as u32)?;
            w.add_kv("dflash.conv_group_size", g as u32)?;
        }
        if let Some((r, k)) = self.selector {
            w.add_kv("dflash.selector_rank", r as u32)?;
            w.add_kv("dflash.selector_top_k", k as u32)?;
        }
        Ok(())
    }

    /// The layers' shape with KV caches of `kv_size` cells of `kv_types`
    /// (NEOX rope over whole heads, no training context).
    fn shape(&self, kv_types: KvTypes, kv_size: i64) -> LayerShape {
        LayerShape::new(&self.core, self.core.neox_rope(0), kv_types, kv_size)
    }
}

/// A DFlash drafter's tensors in the target's context.
#[derive(Clone, Debug)]
pub struct Dflash {
    /// Hyper-parameters.
    pub hp: DflashHparams,
    /// `fc.weight` `[X·Et, E]`.
    pub fc: TensorId,
    /// `enc.output_norm.weight` `[E]`.
    pub enc_norm: TensorId,
    /// `output_norm.weight` `[E]`.
    pub output_norm: TensorId,
    /// Per layer (the same roles as the target's; caches `dft.cache_k_lN`).
    pub layers: Vec<Qwen3Layer>,
    /// Per layer, DFlash2's convolution tensors (`None` for DFlash v1).
    pub convs: Vec<Option<LayerConv>>,
    /// DFlash2's candidate selector (`None` for DFlash v1).
    pub selector: Option<Selector>,
    /// The target's `token_embd.weight` (borrowed).
    pub tok_embd: TensorId,
    /// The target's `output.weight` (borrowed).
    pub output: TensorId,
    /// Where the drafter's weight types came from (its file's tensor
    /// table, or a preset).
    pub types: TensorTypes,
    /// KV cache cells per layer.
    pub kv_size: i64,
    /// The K and V caches' types.
    pub kv_types: KvTypes,
}

/// DFlash2's candidate-selector tensors (shardgraph-models/MODELS.md, section
/// 4.3; mirrored on every device under llama.cpp's policy).
#[derive(Clone, Copy, Debug)]
pub struct Selector {
    /// `selector_hidden.weight` `[E, R]`: the gate `W_h·h` of each row.
    pub hidden: TensorId,
    /// `selector_predecessor.weight` `[R, V]`: codebook A, one column per token.
    pub predecessor: TensorId,
    /// `selector_successor.weight` `[R, V]`: codebook B.
    pub successor: TensorId,
    /// Candidates per position K.
    pub top_k: i64,
}

/// One block-graph step's tensors.
#[derive(Clone, Debug)]
pub struct BlockStep {
    /// `tokens` I32 `[B]`: anchor then masks.
    pub tokens: TensorId,
    /// `inp_pos` I32 `[B]`.
    pub pos: TensorId,
    /// `kq_mask` F16 `[n_kv, B]`.
    pub mask: TensorId,
    /// `k_idxs` I64 `[B]`.
    pub kv_idxs: TensorId,
    /// Cache writes (K, V per layer).
    pub writes: Vec<TensorId>,
    /// Logits `[V, B]`.
    pub logits: TensorId,
    /// Greedy token per row, I32 `[B]`.
    pub argmax: TensorId,
    /// The greedy token's probability per row, F32 `[1, 1, B]`: `soft_max`
    /// of the logits read at `argmax` (both computed where the vocabulary
    /// slices live, so only `B` floats leave the devices).
    pub top_prob: TensorId,
    /// DFlash2's lattice F32 `[E, B]` (`None` for DFlash v1): row 0 zeros;
    /// row `i ≥ 1` holds the K candidate ids of position `i` (as floats)
    /// then K×K edge scores, index `p·K + c` for candidate `c` after the
    /// `p`-th candidate of position `i − 1` (the anchor for `i = 1`), then
    /// zeros. Read with [`best_path`].
    pub lattice: Option<TensorId>,
}

/// One injection-graph step's tensors.
#[derive(Clone, Debug)]
pub struct InjectStep {
    /// `features` F32 `[X·Et, T]`: the tapped target hidden states, layer-major.
    pub features: TensorId,
    /// `inp_pos` I32 `[T]`.
    pub pos: TensorId,
    /// `k_idxs` I64 `[T]`.
    pub kv_idxs: TensorId,
    /// Cache writes (K, V per layer).
    pub writes: Vec<TensorId>,
}

impl Dflash {
    /// Creates the drafter's weights (`dft.` + GGUF names, each matrix of
    /// the type `types` gives its GGUF name, vectors F32) and caches (K and
    /// V of `kv_types`) in the target's context, borrowing the target's
    /// embedding and head.
    ///
    /// # Errors
    /// As [`DflashHparams::validate`]; [`Error::Model`] for a cache type
    /// not offered for the head size ([`KvTypes::check`]) or a weight of a
    /// type the kernels cannot multiply or whose rows are not whole blocks
    /// (naming the tensor and type).
    pub fn new(
        ctx: &mut Context,
        target: impl Into<TargetInfo>,
        hp: DflashHparams,
        types: &TensorTypes,
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        let target: TargetInfo = target.into();
        let kv_types = kv_types.into();
        hp.validate(&target)?;
        const MODEL: &str = "dflash drafter";
        kv_types.check(MODEL, hp.head_dim)?;
        let (e, f) = (hp.n_embd, hp.n_ff);
        let x = hp.target_layers.len() as i64 * hp.target_hidden;
        let matrix = |ctx: &mut Context, name: &str, ne: &[i64]| -> Result<TensorId> {
            named(ctx, types.matrix(MODEL, name, ne)?, ne, &format!("dft.{name}"))
        };
        let vector = |ctx: &mut Context, name: &str, ne: &[i64]| -> Result<TensorId> {
            named(ctx, types.vector(MODEL, name)?, ne, &format!("dft.{name}"))
        };
        let fc = matrix(ctx, "fc.weight", &[x, e])?;
        let enc_norm = vector(ctx, "enc.output_norm.weight", &[e])?;
        let output_norm = vector(ctx, "output_norm.weight", &[e])?;
        let shape = hp.shape(kv_types, kv_size);
        let layers = (0..hp.n_layer)
            .map(|il| new_layer(ctx, ("dft.", MODEL), il, (e, f), &shape, types))
            .collect::<Result<Vec<_>>>()?;
        let mut convs = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            convs.push(match hp.conv {
                Some((k, g)) => {
                    let b = |n: &str| format!("blk.{il}.{n}");
                    let width = 2 * k * (e / g);
                    Some(LayerConv {
                        attn_base: vector(ctx, &b("attn_conv_base"), &[e, k, 2])?,
                        attn_proj: matrix(ctx, &b("attn_conv_proj.weight"), &[e, width])?,
                        ffn_base: vector(ctx, &b("ffn_conv_base"), &[e, k, 2])?,
                        ffn_proj: matrix(ctx, &b("ffn_conv_proj.weight"), &[e, width])?,
                        group: g,
                        n_blocks: 1,
                    })
                }
                None => None,
            });
        }
        let selector = match hp.selector {
            Some((r, k)) => Some(Selector {
                hidden: matrix(ctx, "selector_hidden.weight", &[e, r])?,
                predecessor: matrix(ctx, "selector_predecessor.weight", &[r, target.n_vocab])?,
                successor: matrix(ctx, "selector_successor.weight", &[r, target.n_vocab])?,
                top_k: k,
            }),
            None => None,
        };
        Ok(Dflash {
            convs,
            selector,
            hp,
            fc,
            enc_norm,
            output_norm,
            layers,
            tok_embd: target.tok_embd,
            output: target.output,
            types: types.clone(),
            kv_size,
            kv_types,
        })
    }

    /// The context-injection graph for `n_tokens` target rows
    /// (shardgraph-models/MODELS.md, section 4.4): `features` → `fc` →
    /// RMSNorm·`enc.output_norm` → every layer's K (normed, roped) and V
    /// written at the rows' positions.
    ///
    /// # Errors
    /// [`Error::Model`] for `n_tokens < 1`; constructor errors.
    pub fn build_inject(&self, ctx: &mut Context, n_tokens: i64) -> Result<InjectStep> {
        let hp = &self.hp;
        if n_tokens < 1 {
            return Err(Error::Model { detail: "dflash: injection needs ≥ 1 row".into() });
        }
        let x = hp.target_layers.len() as i64 * hp.target_hidden;
        let features = input(ctx, GgmlType::F32, &[x, n_tokens], "dft.features")?;
        let pos = input(ctx, GgmlType::I32, &[n_tokens], "dft.inp_pos")?;
        let kv_idxs = input(ctx, GgmlType::I64, &[n_tokens], "dft.k_idxs")?;
        let g = ctx.mul_mat(self.fc, features)?;
        let g = rms_norm_w(ctx, g, self.enc_norm, hp.rms_eps)?;
        let mut writes = Vec::new();
        let shape = hp.shape(self.kv_types, self.kv_size);
        for w in &self.layers {
            let rows = kv_rows(ctx, w, g, pos, n_tokens, &shape)?;
            let (wk, wv) = layers::write_kv(ctx, w.cache(), rows, kv_idxs)?;
            writes.push(wk);
            writes.push(wv);
        }
        Ok(InjectStep { features, pos, kv_idxs, writes })
    }

    /// The block graph (shardgraph-models/MODELS.md, section 4.5) for one block
    /// of `block` rows: the target's embedding of the tokens, per layer the
    /// block's K/V written after the context and non-causal attention over
    /// every visible cell (the mask says which), FFN; final norm and the
    /// target's head.
    ///
    /// # Errors
    /// [`Error::Model`] for `block < 1`; constructor errors.
    pub fn build_block(&self, ctx: &mut Context, block: i64) -> Result<BlockStep> {
        self.build_block_window(ctx, block, self.kv_size)
    }

    /// [`Dflash::build_block`] with attention over the first `n_kv` cells of
    /// the drafter's cache (the used window, [`crate::kv_window`]) and a
    /// mask `[n_kv, B]`.
    ///
    /// # Errors
    /// [`Error::Model`] for `block < 1` or `n_kv` outside `1..=kv_size`;
    /// constructor errors.
    pub fn build_block_window(&self, ctx: &mut Context, block: i64, n_kv: i64) -> Result<BlockStep> {
        let hp = &self.hp;
        if block < 1 {
            return Err(Error::Model { detail: "dflash: a block needs ≥ 1 row".into() });
        }
        crate::check_window("dflash", n_kv, self.kv_size)?;
        let tokens = input(ctx, GgmlType::I32, &[block], "dft.tokens")?;
        let pos = input(ctx, GgmlType::I32, &[block], "dft.block_pos")?;
        let mask = input(ctx, GgmlType::F16, &[n_kv, block], "dft.kq_mask")?;
        let kv_idxs = input(ctx, GgmlType::I64, &[block], "dft.block_idxs")?;
        let mut x = ctx.get_rows(self.tok_embd, tokens)?;
        let mut writes = Vec::new();
        let shape = hp.shape(self.kv_types, self.kv_size);
        for (il, w) in self.layers.iter().enumerate() {
            let conv = self.convs.get(il).copied().flatten();
            let (out, wk, wv) = decoder_layer(ctx, w, x, pos, mask, kv_idxs, block, &shape, conv.as_ref())?;
            writes.push(wk);
            writes.push(wv);
            x = out;
        }
        let xn = rms_norm_w(ctx, x, self.output_norm, hp.rms_eps)?;
        let logits = ctx.mul_mat(self.output, xn)?;
        let argmax = ctx.argmax(logits)?;
        let top_prob = layers::top_prob(ctx, logits, argmax)?;
        let lattice = match &self.selector {
            Some(sel) => Some(self.build_selector(ctx, sel, logits, xn, tokens, block)?),
            None => None,
        };
        Ok(BlockStep { tokens, pos, mask, kv_idxs, writes, logits, argmax, top_prob, lattice })
    }

    /// DFlash2's candidate selector over one block's `logits` `[V, B]` and
    /// normed hidden states `t_embd` `[E, B]` (shardgraph-models/MODELS.md,
    /// section 4.7, with one block): the top K candidates per row, each one's
    /// own logit (`get_rows` on the vocabulary, so a vocabulary-split head is
    /// read where its slices live), the gate `W_h·h`, and per position the edge
    /// scores `⟨A[p] ⊙ gate, B[c]⟩ + logit[c]` from every candidate `p` of the
    /// previous position (the anchor for position 1), packed into the `[E, B]`
    /// lattice of [`BlockStep::lattice`].
    fn build_selector(
        &self,
        ctx: &mut Context,
        sel: &Selector,
        logits: TensorId,
        t_embd: TensorId,
        tokens: TensorId,
        block: i64,
    ) -> Result<TensorId> {
        let (e, k, v) = (self.hp.n_embd, sel.top_k, ctx.tensor(logits)?.ne[0]);
        let rank = ctx.tensor(sel.hidden)?.ne[1];
        let cand = ctx.top_k(logits, k as i32)?; // I32 [K, B]
        let l3 = ctx.reshape_3d(logits, 1, v, block)?;
        let unary = ctx.get_rows(l3, cand)?; // [1, K, B]
        let unary = ctx.reshape_2d(unary, k, block)?;
        let gate = ctx.mul_mat(sel.hidden, t_embd)?; // [R, B]
                                                     // Zeros in the shape of one column (a fill of a view of `t_embd`:
                                                     // a leaf made here would be a stored tensor of every step's plan,
                                                     // which the fit, sizing stored tensors from the model's, missed).
        let mut packed = {
            let col = ctx.view_2d(t_embd, e, 1, ctx.tensor(t_embd)?.nb[1], 0)?;
            ctx.fill(col, 0.0)?
        };
        // One run of positions [p0, p0 + n) with `n_pred` predecessor ids per position.
        let run = |ctx: &mut Context, p0: i64, n: i64, preds: TensorId, n_pred: i64| -> Result<TensorId> {
            let i32s = ctx.tensor(cand)?.nb[1];
            let c_run = ctx.view_2d(cand, k, n, i32s, p0 as usize * i32s)?;
            let c_run = ctx.cont(c_run)?;
            let c_flat = ctx.reshape_1d(c_run, k * n)?;
            let succ = ctx.get_rows(sel.successor, c_flat)?; // [R, K·n]
            let succ = ctx.reshape_3d(succ, rank, k, n)?;
            let p_flat = ctx.reshape_1d(preds, n_pred * n)?;
            let pred = ctx.get_rows(sel.predecessor, p_flat)?; // [R, n_pred·n]
            let pred = ctx.reshape_3d(pred, rank, n_pred, n)?;
            let f32s = ctx.tensor(gate)?.nb[1];
            let g_run = ctx.view_2d(gate, rank, n, f32s, p0 as usize * f32s)?;
            let g_run = ctx.cont(g_run)?;
            let g_run = ctx.reshape_3d(g_run, rank, 1, n)?;
            let g_rep = ctx.repeat_4d(g_run, rank, n_pred, n, 1)?;
            let cond = ctx.mul(pred, g_rep)?;
            let mut s = ctx.mul_mat(succ, cond)?; // [K (successor c), n_pred (predecessor p), n]
            if n_pred == 1 {
                s = ctx.repeat_4d(s, k, k, n, 1)?;
            }
            let u_nb = ctx.tensor(unary)?.nb[1];
            let u_run = ctx.view_2d(unary, k, n, u_nb, p0 as usize * u_nb)?;
            let u_run = ctx.cont(u_run)?;
            let u_run = ctx.reshape_3d(u_run, k, 1, n)?;
            let u_rep = ctx.repeat_4d(u_run, k, k, n, 1)?;
            let s = ctx.add(s, u_rep)?;
            let s = ctx.reshape_2d(s, k * k, n)?;
            let ids = ctx.cast(c_run, GgmlType::F32)?;
            let row = ctx.concat(ids, s, 0)?;
            ctx.pad(row, (e - k - k * k) as i32, 0, 0, 0)
        };
        if block > 1 {
            let anchor = ctx.view_1d(tokens, 1, 0)?;
            let anchor = ctx.cont(anchor)?;
            let r1 = run(ctx, 1, 1, anchor, 1)?;
            packed = ctx.concat(packed, r1, 1)?;
        }
        if block > 2 {
            // Predecessors of positions 2..B are the candidates of positions 1..B−1.
            let i32s = ctx.tensor(cand)?.nb[1];
            let prev = ctx.view_2d(cand, k, block - 2, i32s, i32s)?;
            let prev = ctx.cont(prev)?;
            let rest = run(ctx, 2, block - 2, prev, k)?;
            packed = ctx.concat(packed, rest, 1)?;
        }
        Ok(packed)
    }
}

/// Reads DFlash2's lattice (shardgraph-models/MODELS.md, section 4.7): from the
/// anchor, at each position `i = 1..=n_max` take the best-scoring candidate
/// after the previous pick; stop where `p_min > 0` and that candidate's softmax
/// probability among the K scores is below `p_min`. Returns the drafted ids.
///
/// `lattice` is F32 `[E, B]` as [`BlockStep::lattice`] describes, `k` the
/// candidates per position. Rows beyond the lattice end the path.
pub fn best_path(lattice: &[f32], n_embd: usize, k: usize, n_max: usize, p_min: f32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut pred = 0usize;
    for i in 1..=n_max {
        let span = |a: usize, b: usize, w: usize| Some(a.checked_mul(w)?..b.checked_mul(w)?);
        let Some(row) = span(i, i + 1, n_embd).and_then(|r| lattice.get(r)) else { break };
        let Some(scores) = span(pred + 1, pred + 2, k).and_then(|r| row.get(r)) else { break };
        let (best, &top) = match scores.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0))) {
            Some(x) => x,
            None => break,
        };
        if p_min > 0.0 {
            let sum: f64 = scores.iter().map(|&s| ((s - top) as f64).exp()).sum();
            let prob = (1.0 / sum) as f32;
            if prob.is_nan() || prob < p_min {
                break;
            }
        }
        out.push(row[best] as i32);
        pred = best;
    }
    out
}

/// The DFlash drafter in a speculative loop (shardgraph-models/MODELS.md,
/// section 4.9): after every target decode the kept rows' tapped hidden states
/// are injected into the drafter's caches at their positions; a draft is one
/// block `[last, mask × n]` decoded non-causally over the injected context.
/// DFlash v1 reads rows 1..=n greedily, stopping at the first row whose top
/// probability is below `p_min`; DFlash2 reads its selector's lattice with
/// [`best_path`] (the same `p_min` over each position's K edge scores). Either
/// way the vocabulary-split logits stay on their devices (v1 with `p_min > 0`
/// reads them on the host to get the probabilities).
#[derive(Clone, Debug)]
pub struct DflashDrafter {
    /// The drafter's tensors (in the target session's context).
    pub model: Dflash,
    /// llama.cpp's `--spec-draft-p-min`.
    pub p_min: f32,
}

impl DflashDrafter {
    /// Adds a DFlash drafter to `target`'s context and devices: creates its
    /// tensors, extends the split policy with llama.cpp's rules for it, and
    /// places its weights and caches (zero-filled; write them with
    /// [`Qwen3Session::set_weight`] under their `dft.` names).
    ///
    /// # Errors
    /// [`Error::Model`] for a `p_min` outside `0..=1`; as [`Dflash::new`]
    /// and the policy (a drafter whose heads leave a
    /// device without a KV head).
    pub fn attach<T: DraftHost>(
        target: &mut T,
        hp: DflashHparams,
        types: &TensorTypes,
        kv_types: impl Into<KvTypes>,
        p_min: f32,
    ) -> Result<Self> {
        Self::attach_checked(target, hp, types, kv_types.into(), p_min, None)
    }

    /// [`DflashDrafter::attach`], checking the drafter's tensors against
    /// `file` (if given) after they are created and before they are placed.
    fn attach_checked<T: DraftHost>(
        target: &mut T,
        hp: DflashHparams,
        types: &TensorTypes,
        kv_types: KvTypes,
        p_min: f32,
        file: Option<&shardgraph::gguf::GgufFile>,
    ) -> Result<Self> {
        check_p_min("dflash drafter", p_min)?;
        let info = target.info();
        let kv_size = target.kv_size();
        let policy = target.policy_with(&hp, types)?;
        let (ctx, runner, base_len) = target.parts();
        ctx.truncate(*base_len);
        let start = ctx.len();
        let model = Dflash::new(ctx, info, hp, types, kv_types, kv_size);
        let ids: Vec<TensorId> = ctx.ids().skip(start).collect();
        let checked = model.and_then(|m| match file {
            Some(f) => crate::check_file_tensors(f, ctx, &ids, "dft.", "dflash drafter").map(|()| m),
            None => Ok(m),
        });
        let model = match checked {
            Ok(m) => m,
            Err(e) => {
                // The target stays as it was.
                ctx.truncate(start);
                return Err(e);
            }
        };
        runner.set_policy(policy);
        runner.place_all(ctx, &ids, &format!("the drafter's weights and KV caches of {kv_size} cells"))?;
        *base_len = ctx.len();
        Ok(DflashDrafter { model, p_min })
    }
}

impl DflashDrafter {
    /// [`DflashDrafter::attach_file`] from a path.
    ///
    /// # Errors
    /// GGUF errors naming the file; as [`DflashDrafter::attach_file`].
    pub fn attach_gguf<T: DraftHost>(
        target: &mut T,
        path: impl AsRef<std::path::Path>,
        kv_types: impl Into<KvTypes>,
        p_min: f32,
    ) -> Result<Self> {
        Self::attach_file(target, &shardgraph::gguf::GgufFile::open(path)?, kv_types, p_min)
    }

    /// [`DflashDrafter::attach`] from a parsed `dflash` GGUF:
    /// hyper-parameters from its metadata (ranges checked, then checked
    /// against the target), every tensor of the type the file gives it
    /// ([`TensorTypes::from_file`]) and checked against them (presence, a
    /// type the kernels can run, shape, nothing unused) before anything is
    /// placed, then the weights copied straight from the file (GGUF names,
    /// `dft.` in the context).
    ///
    /// # Errors
    /// [`Error::Gguf`] naming a missing or mistyped key; [`Error::Model`]
    /// for a value out of range, a drafter built for another target, a
    /// tensor missing, mismatched or unused; as [`DflashDrafter::attach`].
    pub fn attach_file<T: DraftHost>(
        target: &mut T,
        file: &shardgraph::gguf::GgufFile,
        kv_types: impl Into<KvTypes>,
        p_min: f32,
    ) -> Result<Self> {
        let (hp, vocab_size) = DflashHparams::read(file)?;
        let n_vocab = target.info().n_vocab;
        if let Some(v) = vocab_size {
            if v != n_vocab {
                return Err(Error::Model {
                    detail: format!(
                        "dflash drafter: vocab_size {v} differs from the target's {n_vocab}: built for another target"
                    ),
                });
            }
        }
        let types = TensorTypes::from_file(file);
        let d = DflashDrafter::attach_checked(target, hp, &types, kv_types.into(), p_min, Some(file))?;
        let (ctx, runner, base_len) = target.parts();
        let names: Vec<(String, TensorId)> = ctx
            .ids()
            .take(*base_len)
            .filter_map(|id| {
                let n = &ctx.tensor(id).ok()?.name;
                (n.starts_with("dft.") && !n.starts_with("dft.cache_")).then(|| (n["dft.".len()..].to_string(), id))
            })
            .collect();
        for (name, id) in names {
            shardgraph::gguf::load_tensor_into_split_store(file, &name, ctx, id, runner.store_mut())
                .map_err(|e| Error::Model { detail: format!("dflash drafter: {e}") })?;
        }
        runner.upload()?;
        Ok(d)
    }
}

fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(-65504.0, 65504.0)
    }
}

impl<T: DraftHost> Drafter<T> for DflashDrafter {
    fn taps(&self) -> Vec<usize> {
        self.model.hp.target_layers.clone()
    }

    fn draft(&mut self, target: &mut T, last: i32, pos: i64, n_max: usize) -> Result<Vec<i32>> {
        let hp = &self.model.hp;
        let n = n_max.min(hp.block_size - 1);
        let rows = n as i64 + 1;
        if pos + rows > self.model.kv_size {
            return Ok(Vec::new());
        }
        let (ctx, runner, base_len) = target.parts();
        let n_kv = crate::kv_window(self.model.kv_size, pos + rows);
        let (model, with_prob) = (&self.model, self.p_min > 0.0);
        let sg = runner.graphs.get_or_build(ctx, *base_len, ("dflash block", rows, n_kv, with_prob), |ctx| {
            let b = model.build_block_window(ctx, rows, n_kv)?;
            // The greedy rows and their probabilities (v1) or the selector's
            // lattice (DFlash2) are computed where the vocabulary slices live;
            // the logits never leave the devices.
            let mut outs = b.writes.clone();
            match b.lattice {
                Some(l) => outs.push(l),
                None => {
                    outs.push(b.argmax);
                    if with_prob {
                        outs.push(b.top_prob);
                    }
                }
            }
            Ok((b, outs))
        })?;
        let (b, outs, g) = (&sg.step, &sg.outputs, &sg.graph);
        let mut toks = vec![last];
        toks.extend(std::iter::repeat_n(hp.mask_token, n));
        let positions: Vec<i32> = (0..rows).map(|i| (pos + i) as i32).collect();
        // Non-causal: every row sees the context and the whole block.
        let mask = mask_bytes(n_kv, std::iter::repeat_n(pos + rows - 1, rows as usize));
        let inputs = vec![
            (b.tokens, i32_bytes(&toks)),
            (b.pos, i32_bytes(&positions)),
            (b.mask, mask),
            (b.kv_idxs, cell_bytes(&positions)),
        ];
        let rep = runner.run(ctx, g, &inputs, outs)?;
        let k = b.writes.len();
        if b.lattice.is_some() {
            let lattice = f32s(&rep.outputs[k].bytes);
            let top_k = self.model.selector.map_or(1, |s| s.top_k) as usize;
            return Ok(best_path(&lattice, hp.n_embd as usize, top_k, n, self.p_min));
        }
        let best = i32s(&rep.outputs[k].bytes);
        let top_prob: Option<Vec<f32>> = (self.p_min > 0.0).then(|| f32s(&rep.outputs[k + 1].bytes));
        let mut drafts = Vec::with_capacity(n);
        for (r, &tok) in best.iter().enumerate().take(n + 1).skip(1) {
            if let Some(p) = &top_prob {
                if p.get(r).is_none_or(|&p| p.is_nan() || p < self.p_min) {
                    break;
                }
            }
            drafts.push(tok);
        }
        Ok(drafts)
    }

    fn accept(&mut self, target: &mut T, _batch: &[i32], start: i64, out: &StepOutput, kept: usize) -> Result<()> {
        // Inject the kept rows' features (layer-major per row) at their positions.
        let hp = &self.model.hp;
        let et = hp.target_hidden as usize;
        let mut feats = Vec::with_capacity(kept * et * hp.target_layers.len() * 4);
        for r in 0..kept {
            for &l in &hp.target_layers {
                let tap = out
                    .taps
                    .iter()
                    .find(|t| t.0 == l)
                    .ok_or_else(|| Error::Model { detail: format!("dflash: the target did not tap layer {l}") })?;
                let row = tap
                    .1
                    .get(r * et..(r + 1) * et)
                    .ok_or_else(|| Error::Model { detail: format!("dflash: tap of layer {l} has no row {r}") })?;
                feats.extend(row.iter().flat_map(|&x| sanitize(x).to_le_bytes()));
            }
        }
        let (ctx, runner, base_len) = target.parts();
        let model = &self.model;
        let sg = runner.graphs.get_or_build(ctx, *base_len, ("dflash inject", kept), |ctx| {
            let inj = model.build_inject(ctx, kept as i64)?;
            let outs = inj.writes.clone();
            Ok((inj, outs))
        })?;
        let (inj, g) = (&sg.step, &sg.graph);
        let pos: Vec<u8> = (0..kept as i64).flat_map(|i| ((start + i) as i32).to_le_bytes()).collect();
        let idx: Vec<u8> = (0..kept as i64).flat_map(|i| (start + i).to_le_bytes()).collect();
        let inputs = vec![(inj.features, feats), (inj.pos, pos), (inj.kv_idxs, idx)];
        runner.run(ctx, g, &inputs, &inj.writes)?;
        Ok(())
    }
}

/// [`qwen3_policy`] for a target with a DFlash drafter in the same context (its
/// tensors named `dft.` + the GGUF name): the drafter's layers and caches split
/// like the target's (shardgraph-models/MODELS.md, section 7.5), each by the
/// blocks of its own weights' types (`drafter_types`), `fc` and the norms
/// mirrored.
///
/// # Errors
/// As [`qwen3_policy`], for either model's heads.
pub fn qwen3_dflash_policy(
    hp: &Qwen3Hparams,
    types: &TensorTypes,
    drafter: &DflashHparams,
    drafter_types: &TensorTypes,
    ratios: &[f32],
) -> Result<SplitPolicy> {
    check_dflash_heads(drafter, drafter_types, hp.n_vocab, ratios)?;
    let policy = qwen3_rules(hp, types, ratios)?;
    Ok(dflash_rules(policy, drafter, drafter_types, ratios.len()).rule("*", SplitSpec::Mirrored))
}

/// Checks that a DFlash drafter's heads give every device with a non-zero
/// ratio a KV head too (as a `qwen3` target's must), before either model's
/// rules are made.
///
/// # Errors
/// As [`qwen3_policy`], the message naming the drafter's heads.
fn check_dflash_heads(drafter: &DflashHparams, types: &TensorTypes, n_vocab: i64, ratios: &[f32]) -> Result<()> {
    let dhp = drafter_as_qwen3(drafter, n_vocab);
    qwen3_policy(&dhp, types, ratios).map(drop).map_err(|e| drafter_error(&dhp, e))
}

/// The DFlash drafter's rules on top of its target's `policy`
/// (shardgraph-models/MODELS.md, section 7.5): its tensors are named `dft.` +
/// the GGUF name, its layers and caches split like a `qwen3` target's, with
/// its own granules (each layer's from its own weights' types); `fc`, the
/// norms and DFlash2's convolution and selector tensors are left to the
/// caller's final "everything else mirrored".
fn dflash_rules(policy: SplitPolicy, drafter: &DflashHparams, types: &TensorTypes, n_dev: usize) -> SplitPolicy {
    layer_rules(policy, "dft.", &qwen3_layer_granules(&drafter.core, types, n_dev))
}

/// [`qwen35_policy`](crate::qwen35::qwen35_policy) for a target with a DFlash
/// drafter in the same context (`dft.` names): the drafter's layers and
/// caches split like a `qwen3` target's (shardgraph-models/MODELS.md,
/// section 7.5), `fc`, norms, convolution and selector tensors mirrored.
///
/// # Errors
/// As [`qwen35_policy`](crate::qwen35::qwen35_policy), and for the drafter's
/// heads.
pub fn qwen35_dflash_policy(
    hp: &Qwen35Hparams,
    types: &TensorTypes,
    drafter: &DflashHparams,
    drafter_types: &TensorTypes,
    ratios: &[f32],
) -> Result<SplitPolicy> {
    check_dflash_heads(drafter, drafter_types, hp.n_vocab, ratios)?;
    let policy = qwen35_rules(hp, types, ratios)?;
    // On one device qwen35_rules has no rules (nothing is split), nor does the drafter.
    let policy = if ratios.len() > 1 { dflash_rules(policy, drafter, drafter_types, ratios.len()) } else { policy };
    Ok(policy.rule("*", SplitSpec::Mirrored))
}

/// Says that a policy error is about the drafter's heads, not the target's.
fn drafter_error(dhp: &Qwen3Hparams, e: Error) -> Error {
    let inner = match e {
        Error::Model { detail } => detail,
        other => other.to_string(),
    };
    Error::Model {
        detail: format!(
            "dflash drafter ({} heads / {} KV heads of {}): {inner}",
            dhp.n_head, dhp.n_head_kv, dhp.head_dim
        ),
    }
}

/// A DFlash drafter's layer shapes as a `qwen3` model's (for the check of its heads).
fn drafter_as_qwen3(drafter: &DflashHparams, n_vocab: i64) -> Qwen3Hparams {
    Qwen3Hparams { core: drafter.core.clone(), n_vocab, n_ctx_train: 4096 }
}
