//! The tiny `qwen35` the hybrid tests share.

use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen35::Qwen35Hparams;

/// 4 layers (delta-net, attention, delta-net, attention); 6 key heads and
/// 12 value heads of 64 (head ratio 2), so 3 devices each get key heads in
/// llama.cpp's granules of 128 rows; 6 query / 3 KV heads.
pub fn tiny() -> Qwen35Hparams {
    Qwen35Hparams {
        core: HparamsCore {
            n_layer: 4,
            n_embd: 256,
            n_ff: 512,
            n_head: 6,
            n_head_kv: 3,
            head_dim: 64,
            rms_eps: 1e-6,
            rope_base: 1e7,
        },
        n_vocab: 320,
        n_rot: 16,
        rope_sections: [3, 3, 2, 0],
        full_attention_interval: 2,
        d_conv: 4,
        d_state: 64,
        n_k_heads: 6,
        n_v_heads: 12,
        n_nextn: 0,
        n_ctx_train: 4096,
    }
}
