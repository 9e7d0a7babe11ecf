//! The small `qwen3` target and DFlash (v1) drafter the speculative tests
//! share, and plain greedy decoding by hand (no speculative code) as their
//! reference.
#![allow(dead_code)]

use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::Qwen3Hparams;
use shardgraph_models::step::Target;

/// A `qwen3` of 2 layers, n_embd 128, n_ff 256, 6 heads / 3 KV heads of 32,
/// vocabulary 200.
pub fn qwen3_hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(2, 128, 256, 6, 3, 32), n_vocab: 200, n_ctx_train: 4096 }
}

/// A DFlash drafter for [`qwen3_hp`] (v1: no convolution, no selector):
/// 2 layers, block 5, taps of target layers 1 and 2.
pub fn dflash_hp() -> DflashHparams {
    DflashHparams {
        core: HparamsCore::qwen3(2, 128, 256, 6, 3, 32),
        target_layers: vec![1, 2],
        target_hidden: 128,
        block_size: 5,
        mask_token: 199,
        conv: None,
        selector: None,
    }
}

/// Greedy decoding by hand: the prompt, then one token at a time, each the
/// target's argmax; `n` tokens.
pub fn plain_greedy<T: Target>(s: &mut T, prompt: &[i32], n: usize) -> Vec<i32> {
    let mut last = *s.decode(prompt, &[], false).unwrap().argmax.last().unwrap();
    let mut out = vec![last];
    while out.len() < n {
        last = s.decode(&[last], &[], false).unwrap().argmax[0];
        out.push(last);
    }
    out
}
