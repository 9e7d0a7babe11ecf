//! Greedy decoding, seeded sessions and the logits error measure shared by
//! the model tests.
#![allow(dead_code)]

use shardgraph::split::Devices;
use shardgraph::tensor::quant::quantize_chunk;
use shardgraph::{Context, GgmlType};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams, Qwen3Session};
use shardgraph_models::runner::Runner;
use shardgraph_models::step::Target;
use shardgraph_models::types::TensorTypes;

#[path = "nmse.rs"]
mod nmse;
#[path = "rng.rs"]
pub mod rng;
// Not every test that includes this file compares logits.
#[allow(unused_imports)]
pub use nmse::nmse;
pub use rng::values;

/// A small `qwen3` (2 layers, n_embd 64, 6 heads / 3 KV heads of 32,
/// n_ff 128, vocabulary 96): its heads split over 1, 2 and 3 devices.
pub fn tiny_hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(2, 64, 128, 6, 3, 32), n_vocab: 96, n_ctx_train: 4096 }
}

/// A `qwen3` session for `hp` on `ratios` (one thread per device), KV cache
/// `kv` × `kv_size` cells, with seeded weights: norm weights around 1 (±0.1),
/// the others within ±1.5/√ne0, quantized to `types`.
pub fn seeded_session(
    hp: Qwen3Hparams,
    ratios: &[f32],
    types: &TensorTypes,
    kv: GgmlType,
    kv_size: i64,
) -> Qwen3Session {
    seeded_session_on(
        hp,
        &Devices::cpu(ratios.len(), 1).unwrap().with_tensor_split(ratios).unwrap(),
        types,
        kv,
        kv_size,
    )
}

/// [`seeded_session`] on `devices` (their tensor split and split mode).
pub fn seeded_session_on(
    hp: Qwen3Hparams,
    devices: &Devices,
    types: &TensorTypes,
    kv: GgmlType,
    kv_size: i64,
) -> Qwen3Session {
    let mut ctx = Context::new();
    let model = Qwen3::new(&mut ctx, hp, types, kv, kv_size).unwrap();
    let policy = devices.model_policy(model.hp.core.n_layer, |r| qwen3_policy(&model.hp, types, r)).unwrap();
    let runner = Runner::new(policy, devices).unwrap();
    let mut s = Qwen3Session::new(model, ctx, runner).unwrap();
    let weights: Vec<(String, GgmlType, [i64; 4])> = s
        .ctx()
        .ids()
        .take(s.model().base_len)
        .map(|id| s.ctx().tensor(id).unwrap())
        .filter(|t| !t.name.starts_with("cache_"))
        .map(|t| (t.name.clone(), t.ty, t.ne))
        .collect();
    for (k, (name, ty, ne)) in weights.iter().enumerate() {
        let n = ne.iter().product::<i64>() as usize;
        let v = if name.ends_with("norm.weight") {
            values(n, k as u64 + 1, 0.1, 1.0)
        } else {
            values(n, k as u64 + 1, 1.5 / (ne[0] as f32).sqrt(), 0.0)
        };
        let rows = n / ne[0] as usize;
        let mut bytes = vec![0u8; ty.row_size(ne[0]).unwrap() * rows];
        quantize_chunk(*ty, &v, &mut bytes, rows, ne[0] as usize).unwrap();
        s.set_weight(name, &bytes).unwrap();
    }
    s
}

/// Prompt, then greedy decoding of `steps` tokens on a `qwen3` or `qwen35`
/// session; returns tokens and the logits of every step.
pub fn generate(s: &mut impl Target, prompt: &[i32], steps: usize) -> (Vec<i32>, Vec<Vec<f32>>) {
    let out = s.decode(prompt, &[], true).unwrap();
    let mut tokens = vec![*out.argmax.last().unwrap()];
    let mut logits = vec![out.logits.unwrap()];
    for _ in 1..steps {
        let o = s.decode(&[*tokens.last().unwrap()], &[], true).unwrap();
        tokens.push(o.argmax[0]);
        logits.push(o.logits.unwrap());
    }
    (tokens, logits)
}
