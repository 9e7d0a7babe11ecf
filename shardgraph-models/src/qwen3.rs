//! The `qwen3` dense target (llama.cpp's `LLM_ARCH_QWEN3`,
//! shardgraph-models/MODELS.md, section 2): RMSNorm, GQA attention with
//! per-head q/k RMSNorm and NEOX rope, a KV cache written with `set_rows` and
//! read by `flash_attn_ext` (K and V of their own types), SwiGLU FFN, an
//! output head that is `output.weight` or, in a file without it, the token
//! embedding (tied). Tensor names and metadata keys are llama.cpp's
//! (`blk.N.attn_q.weight`, `qwen3.embedding_length`, ...); each weight has
//! the type its file gives it ([`crate::types::TensorTypes`]).
//!
//! Here: the hyper-parameters, the model's tensors and a
//! step's graph ([`Qwen3`], its layers the shared [`super::decoder`] layer),
//! the session that decodes one sequence on N devices ([`Qwen3Session`],
//! the speculative loop's [`Target`]) and llama.cpp's split policy for the
//! model ([`qwen3_policy`]).

use super::decoder::{decoder_layer, new_layer, LayerShape, Qwen3Layer};
use super::hparams::{read_shared, ArchKeys, HparamsCore, Model};
use super::layers::{input, named, rms_norm_w};
use super::policy::{device_without, layer_rules, qwen3_layer_granules};
use super::runner::Runner;
use super::step::{cell_bytes, head_rows, i32_bytes, mask_bytes, step_output, Outputs, StepOutput, Target};
use super::types::{KvTypes, TensorTypes, OUTPUT};
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::ops::RopeParams;
use shardgraph::split::{Devices, SplitPolicy, SplitSpec};
use shardgraph::tensor::{GgmlType, TensorId};

/// Hyper-parameters of a `qwen3` model: the shared core (`qwen3.*` keys,
/// [`HparamsCore`]; `hp.n_embd` reads through to it) and its own (GGUF keys
/// in brackets).
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3Hparams {
    /// Layers, sizes, heads, RMSNorm ε and rope base.
    pub core: HparamsCore,
    /// Vocabulary size V (`qwen3.vocab_size` / rows of `token_embd.weight`).
    pub n_vocab: i64,
    /// Training context (`qwen3.context_length`).
    pub n_ctx_train: i64,
}

impl std::ops::Deref for Qwen3Hparams {
    type Target = HparamsCore;
    fn deref(&self) -> &HparamsCore {
        &self.core
    }
}

impl std::ops::DerefMut for Qwen3Hparams {
    fn deref_mut(&mut self) -> &mut HparamsCore {
        &mut self.core
    }
}

impl Qwen3Hparams {
    /// Qwen3-8B's dimensions (its published configuration): 36 layers,
    /// n_embd 4096, 32 heads and 8 KV heads of 128, n_ff 12288, vocabulary
    /// 151936. For planning and benchmarks at real size.
    pub fn qwen3_8b() -> Self {
        Qwen3Hparams {
            core: HparamsCore {
                n_layer: 36,
                n_embd: 4096,
                n_ff: 12288,
                n_head: 32,
                n_head_kv: 8,
                head_dim: 128,
                rms_eps: 1e-6,
                rope_base: 1e6,
            },
            n_vocab: 151936,
            n_ctx_train: 40960,
        }
    }

    /// Qwen3-32B's dimensions: 64 layers, n_embd 5120, 64 heads and 8 KV
    /// heads of 128, n_ff 25600, the rest as [`Qwen3Hparams::qwen3_8b`].
    pub fn qwen3_32b() -> Self {
        let b = Self::qwen3_8b();
        Qwen3Hparams { core: HparamsCore { n_layer: 64, n_embd: 5120, n_ff: 25600, n_head: 64, ..b.core }, ..b }
    }

    /// Checks that the shapes fit together (heads divide, sizes positive).
    ///
    /// # Errors
    /// [`Error::Model`] naming the parameter.
    pub fn validate(&self) -> Result<()> {
        let bad = |d: &str| Err(Error::Model { detail: format!("qwen3: {d}") });
        if self.n_layer == 0 || self.n_embd <= 0 || self.n_ff <= 0 || self.n_vocab <= 0 {
            return bad("block_count, embedding_length, feed_forward_length and vocab_size must be positive");
        }
        if self.n_layer > crate::MAX_LAYERS {
            return bad(&format!("block_count {} is over {}", self.n_layer, crate::MAX_LAYERS));
        }
        if !self.heads_divide() {
            return bad(&format!(
                "head_count {} must be a positive multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.head_dim <= 0 || self.head_dim % 2 != 0 {
            return bad(&format!("key_length {} must be positive and even (NEOX rope)", self.head_dim));
        }
        if !self.eps_and_base_positive() {
            return bad("layer_norm_rms_epsilon and rope.freq_base must be finite and positive");
        }
        if self.n_ctx_train <= 0 {
            return bad("context_length must be positive");
        }
        // Sizes the graph multiplies out stay far from overflow (absurd values are an error).
        let limit = 1i64 << 40;
        let sizes = [
            self.n_embd.checked_mul(self.n_vocab),
            self.n_embd.checked_mul(self.n_ff),
            self.n_head.checked_mul(self.head_dim).and_then(|x| x.checked_mul(self.n_embd)),
        ];
        if sizes.iter().any(|x| x.is_none_or(|x| x > limit)) {
            return bad("dimensions too large (products beyond 2^40 elements)");
        }
        Ok(())
    }

    /// Reads the hyper-parameters from a `qwen3` GGUF's metadata (llama.cpp's
    /// keys; the vocabulary from `qwen3.vocab_size` or the rows of
    /// `token_embd.weight`; `key_length` defaults to E/H as in llama.cpp).
    ///
    /// # Errors
    /// [`Error::Model`] for another architecture or inconsistent values;
    /// [`Error::Gguf`] naming a missing or mistyped key.
    pub fn from_gguf(f: &shardgraph::gguf::GgufFile) -> Result<Self> {
        let k = ArchKeys::new(f, Model::Qwen3)?;
        let shared = read_shared(&k)?;
        let n_vocab = match shared.vocab_size {
            Some(v) => v,
            None => f.tensor("token_embd.weight")?.info.ne[1],
        };
        let n_ctx_train = shared.context_length.unwrap_or_default();
        let hp = Qwen3Hparams { core: shared.core, n_vocab, n_ctx_train };
        hp.validate()?;
        Ok(hp)
    }

    /// Writes these hyper-parameters as llama.cpp's `qwen3` metadata and a
    /// minimal vocabulary of `n_vocab` tokens
    /// ([`crate::hparams::add_vocabulary`]; llama.cpp takes token ids
    /// directly).
    ///
    /// # Errors
    /// [`Error::Gguf`] from the writer.
    pub fn add_to_gguf(&self, w: &mut shardgraph::gguf::GgufWriter, name: &str) -> Result<()> {
        w.add_kv("general.architecture", "qwen3")?;
        w.add_kv("general.name", name)?;
        self.core.add_to_gguf(w, "qwen3", self.n_ctx_train as u32)?;
        w.add_kv("qwen3.vocab_size", self.n_vocab as u32)?;
        crate::hparams::add_vocabulary(w, self.n_vocab)?;
        Ok(())
    }

    /// The rope parameters (NEOX over the whole head).
    pub fn rope(&self) -> RopeParams {
        self.core.neox_rope(self.n_ctx_train as i32)
    }
}

/// A `qwen3` model's long-lived tensors in a [`Context`]: weights and KV
/// caches, created once; each step's graph is built on top
/// ([`Qwen3::build`]) and removed with [`Context::truncate`].
#[derive(Clone, Debug)]
pub struct Qwen3 {
    /// Hyper-parameters.
    pub hp: Qwen3Hparams,
    /// `token_embd.weight` `[E, V]`.
    pub tok_embd: TensorId,
    /// `output_norm.weight` `[E]`.
    pub output_norm: TensorId,
    /// `output.weight` `[E, V]`, or `token_embd.weight` when the head is
    /// tied to the embedding (a file without `output.weight`): one tensor
    /// then, read by `get_rows` and by the head.
    pub output: TensorId,
    /// Per layer.
    pub layers: Vec<Qwen3Layer>,
    /// Where the weights' types came from (the file's tensor table, or a
    /// preset).
    pub types: TensorTypes,
    /// KV cache cells per layer.
    pub kv_size: i64,
    /// The K and V caches' types.
    pub kv_types: KvTypes,
    /// Length of the context with only the long-lived tensors.
    pub base_len: usize,
}

/// Inputs and outputs of one step's graph.
#[derive(Clone, Debug)]
pub struct Qwen3Step {
    /// `tokens` I32 `[T]`.
    pub tokens: TensorId,
    /// `inp_pos` I32 `[T]`.
    pub pos: TensorId,
    /// `kq_mask` F16 `[kv_size, T]` (0 or −inf).
    pub mask: TensorId,
    /// `k_idxs` I64 `[T]`: the cache cell each token is written to.
    pub kv_idxs: TensorId,
    /// The cache writes (`set_rows`), in layer order: K then V per layer.
    pub writes: Vec<TensorId>,
    /// Hidden states entering the requested layers, `[E, T]` each (layer
    /// `n_layer` means after the last layer, before the final norm).
    pub taps: Vec<(usize, TensorId)>,
    /// Logits `[V, T]`.
    pub logits: TensorId,
    /// Greedy tokens: `argmax` of each logits column, I32 `[T]`.
    pub argmax: TensorId,
}

impl Qwen3Step {
    /// The graph outputs in the order they must be built: cache writes first
    /// (as llama.cpp expands them before attention reads the cache), then
    /// taps and logits.
    pub fn outputs(&self) -> Vec<TensorId> {
        let mut v = self.writes.clone();
        v.extend(self.taps.iter().map(|t| t.1));
        v.push(self.logits);
        v.push(self.argmax);
        v
    }
}

impl Qwen3 {
    /// Creates the weights (named as in a llama.cpp GGUF, each of the type
    /// `types` gives it; no `output.weight` when `types` says the head is
    /// tied: the head then reads `token_embd.weight`) and the KV caches
    /// (`cache_k_lN`, `cache_v_lN`, `[Hkv·D, kv_size]` of the K and V types)
    /// in `ctx`.
    ///
    /// # Errors
    /// [`Error::Model`] for inconsistent hyper-parameters, a `kv_size` outside
    /// `1..=`[`crate::MAX_CTX`], a cache type llama.cpp or the core does not
    /// offer or whose block does not divide the head ([`KvTypes::check`]),
    /// or a weight whose type the kernels cannot multiply or whose rows are
    /// not whole blocks (naming the tensor and type).
    pub fn new(
        ctx: &mut Context,
        hp: Qwen3Hparams,
        types: &TensorTypes,
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        let kv_types = kv_types.into();
        hp.validate()?;
        crate::check_kv_size("qwen3", kv_size)?;
        kv_types.check("qwen3", hp.head_dim)?;
        let (e, f, v) = (hp.n_embd, hp.n_ff, hp.n_vocab);
        let matrix = |ctx: &mut Context, name: &str, ne: &[i64]| -> Result<TensorId> {
            named(ctx, types.matrix("qwen3", name, ne)?, ne, name)
        };
        let tok_embd = matrix(ctx, "token_embd.weight", &[e, v])?;
        let output_norm = named(ctx, types.vector("qwen3", "output_norm.weight")?, &[e], "output_norm.weight")?;
        let output = if types.is_tied() { tok_embd } else { matrix(ctx, OUTPUT, &[e, v])? };
        let shape = LayerShape::new(&hp, hp.rope(), kv_types, kv_size);
        let layers = (0..hp.n_layer)
            .map(|il| new_layer(ctx, ("", "qwen3"), il, (e, f), &shape, types))
            .collect::<Result<Vec<_>>>()?;
        Ok(Qwen3 {
            hp,
            tok_embd,
            output_norm,
            output,
            layers,
            types: types.clone(),
            kv_size,
            kv_types,
            base_len: ctx.len(),
        })
    }

    /// [`Qwen3::build_window`] attending over all `kv_size` cells.
    ///
    /// # Errors
    /// As [`Qwen3::build_window`].
    pub fn build(&self, ctx: &mut Context, n_tokens: i64, taps: &[usize]) -> Result<Qwen3Step> {
        self.build_window(ctx, n_tokens, self.kv_size, taps)
    }

    /// Builds one step's graph for `n_tokens` tokens on top of the model's
    /// tensors: embedding lookup, every layer (the step's K/V written to the
    /// cache cells given by `k_idxs`, attention over the first `n_kv` cells
    /// under `kq_mask` `[n_kv, T]`), final norm and logits for every token.
    /// `taps` lists the layers whose input hidden state is exported (for a
    /// drafter). `n_kv` is the window of used cells ([`crate::kv_window`]):
    /// a step's cost follows the cells in use, not the cache's size.
    ///
    /// # Errors
    /// [`Error::Model`] for `n_tokens < 1`, a tap beyond `n_layer`, or
    /// `n_kv` outside `1..=kv_size`; constructor errors.
    pub fn build_window(&self, ctx: &mut Context, n_tokens: i64, n_kv: i64, taps: &[usize]) -> Result<Qwen3Step> {
        self.build_step(ctx, n_tokens, n_kv, taps, Outputs::All)
    }

    /// [`Qwen3::build_window`] with the head (final norm's product with
    /// `output`, `logits` `[V, R]`, `argmax` `[R]`) on the rows `outputs`
    /// names: `R = T`, or `R = 1` for [`Outputs::Last`].
    ///
    /// # Errors
    /// As [`Qwen3::build_window`].
    pub fn build_step(
        &self,
        ctx: &mut Context,
        n_tokens: i64,
        n_kv: i64,
        taps: &[usize],
        outputs: Outputs,
    ) -> Result<Qwen3Step> {
        let hp = &self.hp;
        if n_tokens < 1 {
            return Err(Error::Model { detail: format!("qwen3: a step needs ≥ 1 token, got {n_tokens}") });
        }
        crate::check_window("qwen3", n_kv, self.kv_size)?;
        if let Some(&t) = taps.iter().find(|&&t| t > hp.n_layer) {
            return Err(Error::Model { detail: format!("qwen3: tap of layer {t} beyond {} layers", hp.n_layer) });
        }
        let t = n_tokens;
        let tokens = input(ctx, GgmlType::I32, &[t], "tokens")?;
        let pos = input(ctx, GgmlType::I32, &[t], "inp_pos")?;
        let mask = input(ctx, GgmlType::F16, &[n_kv, t], "kq_mask")?;
        let kv_idxs = input(ctx, GgmlType::I64, &[t], "k_idxs")?;
        let shape = LayerShape::new(hp, hp.rope(), self.kv_types, self.kv_size);
        let mut x = ctx.get_rows(self.tok_embd, tokens)?;
        let mut writes = Vec::new();
        let mut tap_ids = Vec::new();
        for (il, w) in self.layers.iter().enumerate() {
            if taps.contains(&il) {
                tap_ids.push((il, x));
            }
            let (out, wk, wv) = decoder_layer(ctx, w, x, pos, mask, kv_idxs, t, &shape, None)?;
            writes.push(wk);
            writes.push(wv);
            x = out;
        }
        if taps.contains(&hp.n_layer) {
            tap_ids.push((hp.n_layer, x));
        }
        let xn = rms_norm_w(ctx, x, self.output_norm, hp.rms_eps)?;
        let xn = head_rows(ctx, xn, outputs)?;
        let logits = ctx.mul_mat(self.output, xn)?;
        let argmax = ctx.argmax(logits)?;
        Ok(Qwen3Step { tokens, pos, mask, kv_idxs, writes, taps: tap_ids, logits, argmax })
    }
}

/// A `qwen3` model decoding one sequence on N devices: the model's tensors
/// in a context, a [`Runner`], and the number of positions already in the
/// KV cache (cache cell = position).
///
/// Made by [`Qwen3Session::load`] (a GGUF path) or
/// [`Qwen3Session::load_file`] (a parsed GGUF) onto [`Devices`], or by
/// [`Qwen3Session::new`] over a model built by hand. Read it through
/// [`Qwen3Session::model`], [`Qwen3Session::ctx`], [`Qwen3Session::runner`]
/// and [`Qwen3Session::n_past`].
#[derive(Debug)]
pub struct Qwen3Session {
    /// The model.
    pub(crate) model: Qwen3,
    /// The context holding the model's tensors (step graphs are built on top).
    pub(crate) ctx: Context,
    /// Devices, plans and storage.
    pub(crate) runner: Runner,
    /// Positions in the cache.
    pub(crate) n_past: i64,
    /// Length of the context with only long-lived tensors (the target's,
    /// and a drafter's once added); step graphs are built after it.
    pub(crate) base_len: usize,
}

impl Qwen3Session {
    /// A session over a model whose tensors are in `ctx` (built by hand with
    /// [`Qwen3::new`]); places weights and caches on the runner's devices
    /// (zero-filled; write weights with [`Qwen3Session::set_weight`]).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when a device cannot hold the weights and
    /// caches (checked before anything is allocated); placement errors (a
    /// policy that cannot split a tensor names it).
    pub fn new(model: Qwen3, ctx: Context, mut runner: Runner) -> Result<Self> {
        let ids: Vec<TensorId> = ctx.ids().take(model.base_len).collect();
        let what = format!("qwen3 weights and KV caches of {} cells", model.kv_size);
        runner.place_all(&ctx, &ids, &what)?;
        let base_len = model.base_len;
        Ok(Qwen3Session { model, ctx, runner, n_past: 0, base_len })
    }

    /// Opens a `qwen3` GGUF and loads it onto `devices` as
    /// [`Qwen3Session::load_file`] does.
    ///
    /// # Example
    /// A generated model ([`crate::generate::write_example_pair`]) on two CPU
    /// devices, split 1:1; its greedy continuation follows a vocabulary
    /// permutation.
    /// ```
    /// use shardgraph::split::Devices;
    /// use shardgraph::GgmlType;
    /// use shardgraph_models::generate::{permutation, write_example_pair};
    /// use shardgraph_models::qwen3::Qwen3Session;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("sg-doc-qwen3-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let (model, _drafter) = write_example_pair(&dir)?;
    /// let devices = Devices::cpu(2, 1)?.with_tensor_split(&[1.0, 1.0])?;
    /// let mut s = Qwen3Session::load(&model, &devices, GgmlType::F16, 256)?;
    /// let out = s.decode(&[5, 6, 7], &[], false)?;
    /// assert_eq!((out.argmax.len(), s.n_past()), (3, 3));
    /// assert_eq!(i64::from(out.argmax[2]), permutation(s.model().hp.n_vocab, 1)[7]);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// GGUF errors naming the file (missing, unreadable, malformed); as
    /// [`Qwen3Session::load_file`].
    pub fn load(
        path: impl AsRef<std::path::Path>,
        devices: &Devices,
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        Self::load_file(&shardgraph::gguf::GgufFile::open(path)?, devices, kv_types, kv_size)
    }

    /// Builds the model of a parsed `qwen3` GGUF with a KV cache of
    /// `kv_size` cells of `kv_types` (llama.cpp's `--ctx-size`,
    /// `--cache-type-k` and `--cache-type-v`; a `GgmlType` is both), every
    /// weight of the type the file gives it ([`TensorTypes::from_file`]; a
    /// file without `output.weight` ties the head to `token_embd.weight`),
    /// splits it over `devices` with llama.cpp's `--split-mode tensor`
    /// policy at their tensor-split ratios, and loads every weight straight
    /// from the file into the devices' parts. Everything the file says is
    /// checked before anything is allocated: the hyper-parameters' ranges,
    /// every weight's presence, type (one the kernels can run) and shape
    /// against them, no tensor the model does not use, and each device's
    /// memory for weights and caches.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming a missing or mistyped key; [`Error::Model`]
    /// for another architecture, a value out of range, a tensor missing,
    /// mismatched or unused, a tensor of a type the kernels cannot run
    /// (naming it and the type), a cache type not offered, or a tensor split
    /// that leaves a device without a KV head; [`Error::OutOfMemory`] naming
    /// the device and bytes.
    pub fn load_file(
        file: &shardgraph::gguf::GgufFile,
        devices: &Devices,
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        let hp = Qwen3Hparams::from_gguf(file)?;
        let types = TensorTypes::from_file(file);
        let mut ctx = Context::new();
        let model = Qwen3::new(&mut ctx, hp.clone(), &types, kv_types, kv_size)?;
        let policy = devices.model_policy(hp.core.n_layer, |r| qwen3_policy(&hp, &types, r))?;
        let mut runner = Runner::new(policy, devices)?;
        let what = format!("qwen3 weights and KV caches of {} cells", model.kv_size);
        crate::place_and_load(file, &ctx, model.base_len, &mut runner, "qwen3", &what)?;
        let base_len = model.base_len;
        Ok(Qwen3Session { model, ctx, runner, n_past: 0, base_len })
    }

    /// The model: hyper-parameters, weights and caches (their ids in
    /// [`Qwen3Session::ctx`]), cache size and type.
    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// The context holding the model's tensors (a drafter's after them, once
    /// attached) and the step graphs built on top.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The devices, split policy, plans and device-resident storage.
    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Positions decoded (the next token's position; cache cell = position).
    pub fn n_past(&self) -> i64 {
        self.n_past
    }

    /// Where the model's weight types came from (the file's tensor table,
    /// or the preset it was built with).
    pub fn model_types(&self) -> &TensorTypes {
        &self.model.types
    }

    /// Writes a weight's full single-device bytes (ggml layout of its type).
    ///
    /// # Errors
    /// [`Error::Model`] for an unknown name or bytes not of the weight's size.
    pub fn set_weight(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let id = self.ctx.find(name).ok_or_else(|| Error::Model { detail: format!("qwen3: no tensor {name:?}") })?;
        let want = self.ctx.tensor(id)?.nbytes();
        if bytes.len() != want {
            return Err(Error::Model { detail: format!("qwen3: {name} takes {want} bytes, given {}", bytes.len()) });
        }
        self.runner.store_mut().set_tensor(&self.ctx, id, 0, bytes)
    }

    /// Runs `tokens` at positions `n_past..n_past + T`, writes their K/V,
    /// and returns the greedy next token after each (and the logits if
    /// `want_logits`, and the hidden states entering `taps`). Advances `n_past`.
    ///
    /// # Errors
    /// [`Error::Model`] for no tokens, a token outside the vocabulary, or a
    /// KV cache too small for the positions; run errors.
    pub fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        self.decode_outputs(tokens, taps, want_logits, Outputs::All)
    }

    /// [`Qwen3Session::decode`] with the head on the rows `outputs` names
    /// ([`Target::decode_last`]).
    ///
    /// # Errors
    /// As [`Qwen3Session::decode`].
    pub fn decode_outputs(
        &mut self,
        tokens: &[i32],
        taps: &[usize],
        want_logits: bool,
        outputs: Outputs,
    ) -> Result<StepOutput> {
        let t = tokens.len() as i64;
        let hp = &self.model.hp;
        if let Some(bad) = tokens.iter().find(|&&x| x < 0 || x as i64 >= hp.n_vocab) {
            return Err(Error::Model {
                detail: format!("qwen3: token {bad} outside the vocabulary of {}", hp.n_vocab),
            });
        }
        if self.n_past + t > self.model.kv_size {
            return Err(Error::Model {
                detail: format!(
                    "qwen3: KV cache of {} cells is too small for positions up to {}",
                    self.model.kv_size,
                    self.n_past + t
                ),
            });
        }
        let n_kv = crate::kv_window(self.model.kv_size, self.n_past + t);
        let key = (t, n_kv, taps.to_vec(), want_logits, outputs);
        let (model, base) = (&self.model, self.base_len);
        let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, key, |ctx| {
            let step = model.build_step(ctx, t, n_kv, taps, outputs)?;
            // Only what the caller reads is read back (the logits stay on the
            // devices unless asked for).
            let mut outputs = step.outputs();
            if !want_logits {
                outputs.retain(|&o| o != step.logits);
            }
            Ok((step, outputs))
        })?;
        let (step, outputs, graph) = (&sg.step, &sg.outputs, &sg.graph);
        let pos: Vec<i32> = (0..t).map(|i| (self.n_past + i) as i32).collect();
        let mask = mask_bytes(n_kv, pos.iter().map(|&p| p as i64));
        let inputs = vec![
            (step.tokens, i32_bytes(tokens)),
            (step.pos, i32_bytes(&pos)),
            (step.mask, mask),
            (step.kv_idxs, cell_bytes(&pos)),
        ];
        let start = std::time::Instant::now();
        let rep = self.runner.run(&self.ctx, graph, &inputs, outputs)?;
        log::debug!(
            "qwen3 step: {t} token(s) at position {}, {} devices, {} bytes moved, {:.2} ms",
            self.n_past,
            self.runner.n_devices(),
            rep.bytes_moved,
            start.elapsed().as_secs_f64() * 1e3
        );
        self.n_past += t;
        Ok(step_output(outputs, &rep, step.argmax, &step.taps, want_logits.then_some(step.logits)))
    }

    /// Forgets every position from `n_past` on (llama.cpp's
    /// `llama_memory_seq_rm(seq, n_past, -1)`): later steps overwrite those
    /// cells and the mask hides them until then.
    ///
    /// # Errors
    /// [`Error::Model`] if `n_past` is beyond the current length.
    pub fn rollback(&mut self, n_past: i64) -> Result<()> {
        if n_past < 0 || n_past > self.n_past {
            return Err(Error::Model { detail: format!("qwen3: cannot roll back to {n_past} of {}", self.n_past) });
        }
        self.n_past = n_past;
        Ok(())
    }
}

impl Target for Qwen3Session {
    fn n_past(&self) -> i64 {
        self.n_past
    }

    fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        Qwen3Session::decode(self, tokens, taps, want_logits)
    }

    fn decode_last(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        self.decode_outputs(tokens, taps, want_logits, Outputs::Last)
    }

    fn rollback(&mut self, n_past: i64) -> Result<()> {
        Qwen3Session::rollback(self, n_past)
    }
}

/// The split policy llama.cpp assigns a `qwen3` model under
/// `--split-mode tensor` with tensor split `ratios`: Q/K/V and FFN gate/up
/// split on their output rows (axis 1) by whole GQA groups, heads and
/// `lcm(block, 128)` rows; the output projection and FFN down on their input
/// axis (0); KV caches on axis 0 by heads; the output head on the
/// vocabulary (a tied head: `token_embd.weight`, the one tensor the
/// embedding lookup and the head read, so the lookup is
/// vocabulary-parallel); everything else mirrored. Each layer's granules
/// follow the blocks of its own weights' types (`types`: a file may mix
/// them per layer); a layer whose granule does not divide its rows keeps
/// that part mirrored, and so does a layer whose KV granule would leave a
/// device with a non-zero ratio no KV head (more devices than KV heads, or
/// heads narrower than `attn_output`'s blocks). (llama.cpp also rotates
/// uneven remainders per layer; this policy gives the remainder to the last
/// device.)
///
/// # Errors
/// [`Error::Model`] for invalid hyper-parameters or ratios.
pub fn qwen3_policy(hp: &Qwen3Hparams, types: &TensorTypes, ratios: &[f32]) -> Result<SplitPolicy> {
    Ok(qwen3_rules(hp, types, ratios)?.rule("*", SplitSpec::Mirrored))
}

/// The rules of [`qwen3_policy`] without the final "everything else mirrored"
/// (a DFlash drafter's are added to them).
pub(crate) fn qwen3_rules(hp: &Qwen3Hparams, types: &TensorTypes, ratios: &[f32]) -> Result<SplitPolicy> {
    hp.validate()?;
    let mut layers = qwen3_layer_granules(hp, types, ratios.len());
    // A layer whose KV granule leaves a device with a non-zero ratio no KV
    // head (more devices than heads, or heads smaller than the blocks of
    // `attn_output`) keeps its attention mirrored, as a granule that does
    // not divide its rows does: every device computes it whole.
    let what = format!("{} KV heads", hp.n_head_kv);
    for (_, g) in layers.iter_mut() {
        if let Some((_, g_kv)) = g.attn {
            if device_without(ratios, &what, hp.n_head_kv * hp.head_dim, g_kv)?.is_some() {
                g.attn = None;
            }
        }
    }
    let policy = layer_rules(SplitPolicy::new(ratios)?, "", &layers);
    let head = if types.is_tied() { "token_embd.weight" } else { OUTPUT };
    Ok(policy.rule(head, SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] }))
}
