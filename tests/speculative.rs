//! Speculative decoding on the tiny `qwen3` target (permutation weights, so
//! the greedy continuation is known and drafts can be right or wrong on
//! purpose): the output equals plain greedy decoding token for token on 1,
//! 2 and 3 CPU devices, ratios 1:1 and 3:1, KV cache F16 and Q4_0, whether
//! every draft is accepted, none is, or some are (forced rejections roll the
//! KV cache back).

use shardgraph::models::generate::{permutation, write_qwen3_gguf_with, Weights};
use shardgraph::models::qwen3::{Qwen3Hparams, Qwen3Session, Qwen3Types};
use shardgraph::models::speculative::{generate, Drafter, SpecParams};
use shardgraph::GgmlType;

/// Drafts the permutation's continuation, wrong at every position `p` with
/// `p % every == 0` (never wrong when `every == 0`), or always wrong.
struct PermDrafter {
    perm: Vec<i64>,
    every: i64,
    all_wrong: bool,
}

impl Drafter for PermDrafter {
    fn draft(&mut self, _: &mut Qwen3Session, last: i32, pos: i64, n_max: usize) -> shardgraph::Result<Vec<i32>> {
        let v = self.perm.len() as i64;
        let mut out = Vec::new();
        let mut t = last as i64;
        for i in 0..n_max as i64 {
            t = self.perm[t as usize];
            let wrong = self.all_wrong || (self.every > 0 && (pos + i + 1) % self.every == 0);
            out.push(if wrong { ((t + 1) % v) as i32 } else { t as i32 });
        }
        Ok(out)
    }
}

fn hp() -> Qwen3Hparams {
    Qwen3Hparams {
        n_layer: 2,
        n_embd: 128,
        n_ff: 256,
        n_head: 6,
        n_head_kv: 3,
        head_dim: 32,
        n_vocab: 200,
        rms_eps: 1e-6,
        rope_base: 1e6,
        n_ctx_train: 4096,
    }
}

#[test]
fn speculative_output_equals_plain_greedy() {
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("target.gguf");
    write_qwen3_gguf_with(&path, &hp(), &Qwen3Types::all(GgmlType::Q8_0), 11, Weights::Permutation).unwrap();
    let perm = permutation(hp().n_vocab, 11);
    let prompt = [5, 77, 123, 9];
    let n_gen = 20;
    let plain = {
        let mut s = Qwen3Session::from_gguf(&path, &[1.0], 1, GgmlType::F16, 64).unwrap();
        let mut d = PermDrafter { perm: perm.clone(), every: 0, all_wrong: false };
        generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
    };
    for (ratios, kv) in [
        (vec![1.0], GgmlType::F16),
        (vec![1.0, 1.0], GgmlType::F16),
        (vec![3.0, 1.0], GgmlType::Q4_0),
        (vec![1.0, 1.0, 1.0], GgmlType::Q4_0),
    ] {
        for (every, all_wrong) in [(0, false), (3, false), (0, true)] {
            let mut s = Qwen3Session::from_gguf(&path, &ratios, 1, kv, 64).unwrap();
            let mut d = PermDrafter { perm: perm.clone(), every, all_wrong };
            let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 4, n_min: 1 }).unwrap();
            assert_eq!(tokens, plain, "{ratios:?} kv {kv} every {every} all_wrong {all_wrong}: {st:?}");
            if all_wrong {
                assert_eq!(st.accepted, 0, "{st:?}");
            } else if every == 0 {
                assert_eq!(st.accepted, st.drafted, "{st:?}");
                assert!(st.target_steps * 4 <= n_gen + 4, "{st:?}");
            } else {
                assert!(st.accepted > 0 && st.accepted < st.drafted, "{st:?}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dflash_drafter_in_the_loop_keeps_the_output_greedy() {
    use shardgraph::models::dflash::{DflashDrafter, DflashHparams};
    use shardgraph::tensor::quant::quantize_chunk;
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-dflash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("target.gguf");
    write_qwen3_gguf_with(&path, &hp(), &Qwen3Types::all(GgmlType::Q8_0), 13, Weights::Permutation).unwrap();
    let dhp = DflashHparams {
        n_layer: 2,
        n_embd: 128,
        n_ff: 256,
        n_head: 6,
        n_head_kv: 3,
        head_dim: 32,
        rms_eps: 1e-6,
        rope_base: 1e6,
        target_layers: vec![1, 2],
        target_hidden: 128,
        block_size: 5,
        mask_token: 199,
    };
    let prompt = [3, 14, 15, 92, 65];
    let n_gen = 16;
    let mut plain = None;
    for (ratios, kv) in
        [(vec![1.0], GgmlType::F16), (vec![1.0, 1.0], GgmlType::Q4_0), (vec![1.0, 1.0, 1.0], GgmlType::F16)]
    {
        let mut s = Qwen3Session::from_gguf(&path, &ratios, 1, kv, 64).unwrap();
        let mut d = DflashDrafter::attach(&mut s, dhp.clone(), GgmlType::Q8_0, kv, 0.0).unwrap();
        // Seeded drafter weights (random: drafts are mostly rejected, which
        // exercises the rollback of both caches every step).
        let names: Vec<(String, GgmlType, [i64; 4])> = s
            .ctx
            .ids()
            .map(|id| s.ctx.tensor(id).unwrap().clone())
            .filter(|t| t.name.starts_with("dft.") && !t.name.contains("cache_"))
            .map(|t| (t.name.clone(), t.ty, t.ne))
            .collect();
        for (k, (name, ty, ne)) in names.iter().enumerate() {
            let n = ne.iter().product::<i64>() as usize;
            let mut x = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let u = ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                    if name.ends_with("norm.weight") {
                        1.0 + 0.1 * u
                    } else {
                        u * (3.0 / ne[0] as f32).sqrt()
                    }
                })
                .collect();
            let mut bytes = vec![0u8; ty.row_size(ne[0]).unwrap() * n / ne[0] as usize];
            quantize_chunk(*ty, &v, &mut bytes, n / ne[0] as usize, ne[0] as usize).unwrap();
            s.set_weight(name, &bytes).unwrap();
        }
        let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 4, n_min: 1 }).unwrap();
        assert!(st.drafted > 0, "{st:?}");
        let want = plain.get_or_insert_with(|| {
            let mut s = Qwen3Session::from_gguf(&path, &[1.0], 1, GgmlType::F16, 64).unwrap();
            let mut none = PermDrafter { perm: vec![], every: 0, all_wrong: false };
            generate(&mut s, &mut none, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
        });
        assert_eq!(&tokens, want, "{ratios:?} kv {kv}: {st:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
