//! The CUDA backend as a device of the meta backend and as an embedder meets
//! it: a model decoding tensor-parallel on CUDA devices equals the CPU run
//! (plain greedy, and speculative with MTP and DFlash2 drafters),
//! and bad input (out of memory, foreign buffers, a missing GPU) is an
//! `Err` that names the device while other buffers stay valid.
//!
//! Devices: virtual devices on GPU 0 when the driver sees one; otherwise
//! emulated GPUs (`--features cuda-emu`, the kernels run as host C++);
//! otherwise every test says it is skipped.

use shardgraph::backend::cuda::CudaBackend;
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::Devices;
use shardgraph::{Backend, Context, GgmlType, TensorStorage};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::types::TensorTypes;
use std::sync::Arc;

#[path = "common/decode.rs"]
mod decode;
#[path = "common/devices.rs"]
mod devices;
#[path = "common/fixtures.rs"]
mod fixtures;
use decode::{generate, nmse, rng};
use fixtures::run_graph;

#[path = "common/quant_blocks.rs"]
mod quant_blocks;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;

/// `n` CUDA devices (virtual devices on GPU 0, or emulated ones), or `None` with a message.
fn devices(n: usize) -> Option<Vec<CudaBackend>> {
    match CudaBackend::virtual_devices(0, n) {
        Ok(d) => Some(d),
        Err(why) if std::env::var_os("SHARDGRAPH_REQUIRE_GPU").is_some() => {
            panic!("cuda_backend: SHARDGRAPH_REQUIRE_GPU is set but no GPU opened: {why}")
        }
        Err(why) => {
            #[cfg(feature = "cuda-emu")]
            {
                let _ = why;
                Some((0..n).map(|_| CudaBackend::emulated(1 << 30)).collect())
            }
            #[cfg(not(feature = "cuda-emu"))]
            {
                println!("cuda_backend: SKIPPED: no GPU ({why}) and no `cuda-emu` feature");
                None
            }
        }
    }
}

fn hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(2, 256, 256, 2, 2, 128), n_vocab: 96, n_ctx_train: 4096 }
}

/// A qwen3 model decodes on 1 and on 2 CUDA devices (tensor split 1:1) to
/// the CPU's tokens, with logits within quantised-activation rounding; the
/// permutation model's greedy chain is followed exactly.
#[test]
fn qwen3_decodes_on_cuda_devices_as_on_the_cpu() {
    use shardgraph_models::generate::{write_qwen3_gguf_with, Weights};
    let Some(_) = devices(1) else { return };
    let dir = std::env::temp_dir().join(format!("shardgraph-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (K-quant rows split in granules of 256 need more heads than this
    // model has for two devices, so the Q4_K_M-like mix runs on one.)
    for (weights, types, kv, tol, splits) in [
        (Weights::Permutation, TensorTypes::uniform(GgmlType::Q8_0), GgmlType::F16, 1e-3, 2),
        (Weights::Random, TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 1e-5, 2),
        (Weights::Random, TensorTypes::q4_k_m(), GgmlType::Q8_0, 2e-3, 1),
    ] {
        let path = dir.join(
            format!("m-{weights:?}-{}.gguf", types.get("blk.0.attn_q.weight").unwrap())
                .replace([' ', '{', '}', ':'], ""),
        );
        write_qwen3_gguf_with(&path, &hp(), &types, 7, weights).unwrap();
        let prompt = [5, 17, 42, 3];
        let mut cpu = Qwen3Session::load(&path, &devices::cpu(&[1.0]), kv, 32).unwrap();
        let (want, want_logits) = generate(&mut cpu, &prompt, 6);
        for ratios in [vec![1.0f32], vec![1.0, 1.0]].into_iter().take(splits) {
            let Some(devs) = devices(ratios.len()) else { return };
            let devs: Vec<Arc<CudaBackend>> = devs.into_iter().map(Arc::new).collect();
            let on_cuda = Devices::from_backends(devs.iter().map(|d| d.clone() as Arc<dyn Backend>).collect())
                .and_then(|d| d.with_tensor_split(&ratios))
                .unwrap();
            let mut s = Qwen3Session::load(&path, &on_cuda, kv, 32).unwrap();
            let (got, logits) = generate(&mut s, &prompt, 6);
            let worst = logits.iter().zip(&want_logits).map(|(a, b)| nmse(a, b)).fold(0.0, f64::max);
            let stats: Vec<_> = devs.iter().map(|d| d.stats()).collect();
            println!(
                "qwen3 {weights:?} {} on {} CUDA device(s): tokens {got:?}, logits NMSE {worst:.2e}, stats {stats:?}",
                types.get("blk.0.attn_q.weight").unwrap(),
                ratios.len()
            );
            assert_eq!(got, want, "{weights:?} {types:?} on {ratios:?}");
            assert!(worst <= tol, "{weights:?} {types:?} on {ratios:?}: logits NMSE {worst:.3e} > {tol:e}");
            assert!(stats.iter().all(|s| s.device_nodes > 0), "kernels ran on every device: {stats:?}");
            // The KV caches stay in device memory between steps.
            let kept = s.runner().store().device_bytes();
            assert!(kept.iter().all(|&b| b > 0), "device-resident cache bytes {kept:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Out of memory is an `Err` naming the device; buffers allocated before stay valid.
#[test]
fn out_of_memory_is_an_error_and_other_buffers_survive() {
    let Some(mut devs) = devices(1) else { return };
    out_of_memory_on(devs.remove(0));
}

/// The emulated HIP (CDNA) device reports its failures as the CUDA one
/// does: out of memory and out-of-range rows are errors naming the device
/// and the op, and its other buffers and later graphs are unaffected.
#[cfg(feature = "cuda-emu")]
#[test]
fn hip_device_errors_name_the_device_and_op() {
    out_of_memory_on(CudaBackend::emulated_hip(1 << 30));
    let d = CudaBackend::emulated_hip(1 << 30);
    assert!(d.device().name.starts_with("EMUHIP"), "{}", d.device().name);
    out_of_range_rows_on(d);
}

fn out_of_memory_on(d: CudaBackend) {
    let keep = d.alloc_buffer(1024).unwrap();
    keep.set(0, &[7u8; 1024]).unwrap();
    let e = d.alloc_buffer(usize::MAX / 4).unwrap_err();
    assert!(e.to_string().contains(&d.device().name), "{e}");
    assert!(e.to_string().contains("out of device memory"), "{e}");
    let mut back = [0u8; 1024];
    keep.get(0, &mut back).unwrap();
    assert_eq!(back, [7u8; 1024]);
    // Sizes past what any device has (also on a device claiming unlimited
    // memory) are errors, not wrapped-around allocations.
    #[cfg(feature = "cuda-emu")]
    {
        let unlimited = CudaBackend::emulated(usize::MAX);
        for size in [usize::MAX - 300, usize::MAX / 2 + 1, usize::MAX] {
            assert!(unlimited.alloc_buffer(size).is_err(), "{size} bytes");
        }
    }
    // Out-of-range copies are errors, not writes past the buffer.
    assert!(keep.set(1000, &[0u8; 100]).is_err());
    assert!(keep.get(usize::MAX, &mut back).is_err());
}

/// A tensor in another device's buffer, and a graph from another context,
/// are errors that name the device; the device keeps working afterwards.
#[test]
fn foreign_buffers_are_errors() {
    let Some(devs) = devices(2) else { return };
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(GgmlType::F32, 64).unwrap();
    let b = ctx.silu(a).unwrap();
    let g = ctx.build_forward(&[b]).unwrap();
    // Leaf on device 1, result on device 0.
    let mut st = TensorStorage::new();
    st.alloc_tensors(&devs[1], &ctx, &[a]).unwrap();
    GraphAllocator::new(devs[0].buffer_type()).alloc_graph(&devs[0], &ctx, &g, &mut st).unwrap();
    let e = devs[0].compute(&ctx, &g, &st).unwrap_err();
    assert!(e.to_string().contains(&devs[0].device().name), "{e}");
    // A CPU buffer is foreign too.
    let cpu = shardgraph::CpuBackend::with_threads(1).unwrap();
    let mut st2 = TensorStorage::new();
    st2.alloc_tensors(&cpu, &ctx, &[a]).unwrap();
    GraphAllocator::new(devs[0].buffer_type()).alloc_graph(&devs[0], &ctx, &g, &mut st2).unwrap();
    assert!(devs[0].compute(&ctx, &g, &st2).is_err());
    // The device still computes a well-formed graph.
    let mut ok = TensorStorage::new();
    ok.alloc_tensors(&devs[0], &ctx, &[a]).unwrap();
    GraphAllocator::new(devs[0].buffer_type()).alloc_graph(&devs[0], &ctx, &g, &mut ok).unwrap();
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 8.0 - 4.0).collect();
    ok.set_f32(&ctx, a, &x).unwrap();
    devs[0].compute(&ctx, &g, &ok).unwrap();
    let y = ok.get_f32(&ctx, b).unwrap();
    for (xi, yi) in x.iter().zip(&y) {
        assert!((yi - xi / (1.0 + (-xi).exp())).abs() < 1e-6);
    }
}

/// Without a GPU, opening one is an `Err` that says why (never a panic).
#[test]
fn a_missing_gpu_is_an_error() {
    match CudaBackend::virtual_devices(0, 2) {
        Ok(d) => println!("cuda_backend: GPU present: {}", d[0].device().description),
        Err(e) => assert!(e.to_string().contains("cuda"), "{e}"),
    }
    assert!(CudaBackend::virtual_devices(0, 0).is_err());
    assert!(CudaBackend::new(1_000_000).is_err());
}

/// An index out of range in get_rows / set_rows is an `Err` naming the op
/// (the kernels skip it, so nothing outside the tensors is touched), and
/// the device computes the next graph normally.
#[test]
fn out_of_range_rows_are_errors() {
    let Some(mut devs) = devices(1) else { return };
    out_of_range_rows_on(devs.remove(0));
}

fn out_of_range_rows_on(d: CudaBackend) {
    let mut ctx = Context::new();
    let table = ctx.new_tensor_2d(GgmlType::F32, 8, 4).unwrap();
    let idx = ctx.new_tensor_1d(GgmlType::I32, 3).unwrap();
    let rows = ctx.get_rows(table, idx).unwrap();
    let g = ctx.build_forward(&[rows]).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(&d, &ctx, g.leafs()).unwrap();
    GraphAllocator::new(d.buffer_type()).alloc_graph(&d, &ctx, &g, &mut st).unwrap();
    st.set_f32(&ctx, table, &(0..32).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    for bad in [[0, 4, 1], [-1, 0, 0], [0, 1, i32::MAX]] {
        st.set_i32(&ctx, idx, &bad).unwrap();
        let e = d.compute(&ctx, &g, &st).unwrap_err();
        assert!(e.to_string().contains("get_rows") && e.to_string().contains(&d.device().name), "{bad:?}: {e}");
    }
    st.set_i32(&ctx, idx, &[3, 0, 2]).unwrap();
    d.compute(&ctx, &g, &st).unwrap();
    let got = st.get_f32(&ctx, rows).unwrap();
    let want: Vec<f32> = [3, 0, 2].iter().flat_map(|&r| (0..8).map(move |i| (r * 8 + i) as f32)).collect();
    assert_eq!(got, want);
    assert!(d.stats().host_nodes.is_empty(), "get_rows F32 ran on the device: {:?}", d.stats());
}

/// A view that starts off its type's alignment (ggml lets `ggml_view_1d`
/// start at any byte; the random graphs of `tests/split_props.rs` make one)
/// runs on the host, not on the device: a GPU faults on the misaligned
/// load (CUDA_ERROR_MISALIGNED_ADDRESS, sticky for the whole context: seen
/// on an H200, where every later test of the process then failed). Its
/// result equals the CPU backend's bit for bit, the device works on
/// afterwards, and aligned views of the same tensor stay on the device.
#[test]
fn misaligned_views_run_on_the_host_and_equal_the_cpu() {
    let Some(mut devs) = devices(1) else { return };
    let d = devs.remove(0);
    let mut ctx = Context::new();
    let a = ctx.new_tensor_1d(GgmlType::F32, 16).unwrap();
    // F32 values at bytes 10..30 (2 mod 4), then at bytes 8..28.
    let odd = ctx.view_1d(a, 5, 10).unwrap();
    let odd_cont = ctx.cont(odd).unwrap();
    let odd_scaled = ctx.scale(odd, 2.0).unwrap();
    let even = ctx.view_1d(a, 5, 8).unwrap();
    let even_cont = ctx.cont(even).unwrap();
    let outs = [odd_cont, odd_scaled, even_cont];
    let leafs = [(a, (0..16).map(|i| 1.0 + i as f32 / 8.0).collect::<Vec<f32>>())];
    let cpu = shardgraph::CpuBackend::with_threads(1).unwrap();
    let want = run_graph(&cpu, &ctx, &leafs, &outs);
    for run in 0..2 {
        let got = run_graph(&d, &ctx, &leafs, &outs);
        let bits =
            |v: &[Vec<f32>]| v.iter().map(|r| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "run {run}");
    }
    let host = d.stats().host_nodes;
    assert_eq!(host.values().sum::<u64>(), 4, "the two nodes of the misaligned view, twice, on the host: {host:?}");
    assert!(d.stats().device_nodes >= 2, "the aligned view's cont on the device: {:?}", d.stats());
}

/// Attention sinks (gpt-oss) on the device equal the CPU backend: soft_max
/// with sinks, without a mask and with an F16 mask (ALiBi too), and
/// flash_attn_ext with sinks over F16 K/V, an F16 mask (a fully masked row)
/// and GQA, soft-capping off and on; every node runs on the device.
#[test]
fn attention_sinks_on_the_device_equal_the_cpu() {
    let Some(mut devs) = devices(1) else { return };
    let d = devs.remove(0);
    let mut ctx = Context::new();
    let mut leafs = Vec::new();
    let mut seed = 11u64;
    let mut leaf = |ctx: &mut Context, ty: GgmlType, ne: &[i64], vals: Option<Vec<f32>>| {
        let t = ctx.new_tensor(ty, ne).unwrap();
        let n = ne.iter().product::<i64>() as usize;
        seed += 1;
        leafs.push((t, vals.unwrap_or_else(|| decode::values(n, seed, 2.0, 0.0))));
        t
    };
    // soft_max [n_kv = 40, n_q = 6, heads = 8]: sinks per head, around the row maxima.
    let sinks8 = (0..8).map(|h| h as f32 - 3.0).collect::<Vec<_>>();
    let x = leaf(&mut ctx, GgmlType::F32, &[40, 6, 8, 1], None);
    let s8 = leaf(&mut ctx, GgmlType::F32, &[8], Some(sinks8.clone()));
    let causal: Vec<f32> = (0..6 * 40)
        .map(|i| if i % 40 <= 34 + i / 40 && i / 40 != 2 { -((i % 7) as f32) * 0.1 } else { f32::NEG_INFINITY })
        .collect();
    let m = leaf(&mut ctx, GgmlType::F16, &[40, 6, 1, 1], Some(causal));
    let plain = ctx.soft_max_ext(x, None, 0.5, 0.0).unwrap();
    let sm_plain = ctx.soft_max_add_sinks(plain, s8).unwrap();
    let masked = ctx.soft_max_ext(x, Some(m), 0.125, 0.0).unwrap();
    let sm_masked = ctx.soft_max_add_sinks(masked, s8).unwrap();
    let alibi = ctx.soft_max_ext(x, Some(m), 1.0, 8.0).unwrap();
    let sm_alibi = ctx.soft_max_add_sinks(alibi, s8).unwrap();
    // flash_attn_ext: 8 query heads on 2 K/V heads, head size 64, 6 queries over 40 keys.
    let q = leaf(&mut ctx, GgmlType::F32, &[64, 6, 8, 1], None);
    let k = leaf(&mut ctx, GgmlType::F16, &[64, 40, 2, 1], None);
    let v = leaf(&mut ctx, GgmlType::F16, &[64, 40, 2, 1], None);
    let mut outs = vec![sm_plain, sm_masked, sm_alibi];
    for softcap in [0.0, 5.0] {
        let fa = ctx.flash_attn_ext(q, k, v, Some(m), 0.125, 0.0, softcap).unwrap();
        outs.push(ctx.flash_attn_ext_add_sinks(fa, s8).unwrap());
    }
    let cpu = shardgraph::CpuBackend::with_threads(2).unwrap();
    let want = run_graph(&cpu, &ctx, &leafs, &outs);
    let got = run_graph(&d, &ctx, &leafs, &outs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        assert!(g.iter().all(|x| x.is_finite()), "output {i} has non-finite values");
        let e = nmse(g, w);
        println!("cuda_backend: sinks output {i} ({}): nmse {e:.2e}", ctx.tensor(outs[i]).unwrap().op.name());
        // soft_max: the same f32 arithmetic; flash_attn_ext: the CPU dots an
        // F16-rounded query (ggml's), the device an f32 one.
        let bound = if i < 3 { 1e-12 } else { 1e-6 };
        assert!(e < bound, "output {i}: nmse {e:e}");
    }
    // The fully masked query row (2) gives 0 in soft_max and in flash_attn_ext.
    assert!(got[1][2 * 40..3 * 40].iter().all(|&p| p == 0.0));
    assert!(got[3][2 * 64 * 8..3 * 64 * 8].iter().all(|&o| o == 0.0));
    assert!(d.stats().host_nodes.is_empty(), "sinks ran on the host: {:?}", d.stats().host_nodes);
}

/// ggml 0.25.3's newer block types on the device, as random blocks (every
/// grid point, sign pattern and scale bit a file may hold; IQ2_XXS, IQ2_XS
/// and IQ1_S have no quantizer without an importance matrix): `get_rows`
/// and `cpy` to F32 equal the CPU bit for bit; `mul_mat` with 1 and 3
/// columns (matrix-vector kernels) and 16 (dequantized, then the F32
/// product) is within 1e-9 NMSE of the f64 product of the CPU's dequantized
/// weights and within ggml's mul_mat tolerance (5e-4) of the CPU, which
/// rounds the activations to Q8 first; `mul_mat_id` too. IQ4_NL as a K/V
/// cache type: `set_rows` and `cpy` into it equal the CPU's blocks, and
/// `flash_attn_ext` over IQ4_NL K and V is within 5e-4 of the CPU (which
/// rounds q to Q8_0). On the CUDA device and, with the emulator, on the
/// emulated CDNA device (the HIP spelling, 64-wide waves); nothing runs on
/// the host.
#[test]
fn new_block_types_run_on_the_device_as_on_the_cpu() {
    let Some(mut devs) = devices(1) else { return };
    new_block_types_on(devs.remove(0));
    #[cfg(feature = "cuda-emu")]
    new_block_types_on(CudaBackend::emulated_hip(1 << 30));
}

fn new_block_types_on(d: CudaBackend) {
    use GgmlType::*;
    let cpu = shardgraph::CpuBackend::with_threads(2).unwrap();
    let f32_bytes = fixtures::f32_bytes;
    let i32_bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut r = rng::Rng::new(29);
    let types =
        [IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0];
    for ty in types {
        let (k, m, n_expert) = (512i64, 9i64, 3i64);
        let mut ctx = Context::new();
        let w = ctx.new_tensor(ty, &[k, m, n_expert]).unwrap();
        let w0 = ctx.view_2d(w, k, m, ctx.tensor(w).unwrap().nb[1], 0).unwrap();
        let idx = ctx.new_tensor(I32, &[4, n_expert]).unwrap();
        let rows = ctx.get_rows(w, idx).unwrap();
        let deq = ctx.cast(w, F32).unwrap();
        let xs: Vec<_> = [1i64, 3, 16].iter().map(|&n| ctx.new_tensor(F32, &[k, n]).unwrap()).collect();
        let mut outs = vec![rows, deq];
        for &x in &xs {
            outs.push(ctx.mul_mat(w0, x).unwrap());
        }
        let xb = ctx.new_tensor(F32, &[k, 2, 5]).unwrap();
        let ids = ctx.new_tensor(I32, &[2, 5]).unwrap();
        outs.push(ctx.mul_mat_id(w, xb, ids).unwrap());
        let mut leafs = vec![
            (w, quant_blocks::random_blocks(ty, (k * m * n_expert) as usize / ty.block_size(), &mut r)),
            (idx, i32_bytes(&[4, 0, 8, 4, 1, 1, 7, 2, 8, 0, 3, 5])),
            (xb, f32_bytes(&rng::values((k * 10) as usize, 41, 1.0, 0.0))),
            (ids, i32_bytes(&[0, 2, 1, 1, 2, 0, 2, 2, 0, 1])),
        ];
        for (i, &x) in xs.iter().enumerate() {
            let n = ctx.tensor(x).unwrap().nelements() as usize;
            leafs.push((x, f32_bytes(&rng::values(n, 43 + i as u64, 1.0, 0.0))));
        }
        let before = d.stats().host_nodes;
        let want = fixtures::run_graph_bytes(&cpu, &ctx, &leafs, &outs);
        let got = fixtures::run_graph_bytes(&d, &ctx, &leafs, &outs);
        let name = d.device().name.clone();
        assert_eq!(d.stats().host_nodes, before, "{ty} on {name}: nodes ran on the host");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[0]), bits(&want[0]), "{ty} on {name}: get_rows differs from the CPU");
        assert_eq!(bits(&got[1]), bits(&want[1]), "{ty} on {name}: cpy to F32 differs from the CPU");
        // The f64 product of the dequantized first expert and the activations.
        let wf = &want[1][..(k * m) as usize];
        for (i, &x) in xs.iter().enumerate() {
            let xv = &leafs[4 + i].1;
            let xv: Vec<f32> = xv.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let n = ctx.tensor(x).unwrap().ne[1] as usize;
            let exact: Vec<f64> = (0..n)
                .flat_map(|j| {
                    let xj = &xv[j * k as usize..(j + 1) * k as usize];
                    wf.chunks_exact(k as usize)
                        .map(move |wr| wr.iter().zip(xj).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>())
                })
                .collect();
            let (g, c) = (&got[2 + i], &want[2 + i]);
            let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
            let c64: Vec<f64> = c.iter().map(|&v| v as f64).collect();
            let (e_exact, e_cpu) = (nmse(&g64, &exact), nmse(g, c));
            println!("cuda_backend: {name} {ty} mul_mat n={n}: nmse {e_exact:.1e} vs f64, {e_cpu:.1e} vs the CPU ({:.1e} CPU vs f64)", nmse(&c64, &exact));
            assert!(e_exact < 1e-9 && e_cpu < 5e-4, "{ty} on {name}: mul_mat n={n}: nmse {e_exact:e} / {e_cpu:e}");
        }
        let e = nmse(&got[5], &want[5]);
        assert!(e < 5e-4, "{ty} on {name}: mul_mat_id nmse {e:e}");
    }
    iq4_nl_cache_on(&d, &cpu);
}

/// IQ4_NL as a K/V cache on device `d` against `cpu`: rows written by
/// `set_rows` (I32 and I64 indices; a row of zeros among them) and `cpy`
/// equal the CPU's, and `flash_attn_ext` reads IQ4_NL K and V (GQA, an F16
/// mask) within 5e-4 of the CPU; nothing runs on the host.
fn iq4_nl_cache_on(d: &CudaBackend, cpu: &shardgraph::CpuBackend) {
    use GgmlType::*;
    let mut ctx = Context::new();
    let src = ctx.new_tensor(F32, &[64, 3]).unwrap();
    let cache = ctx.new_tensor(IQ4_NL, &[64, 6]).unwrap();
    let i32s = ctx.new_tensor(I32, &[3]).unwrap();
    let i64s = ctx.new_tensor(I64, &[3]).unwrap();
    let cache2 = ctx.new_tensor(IQ4_NL, &[64, 6]).unwrap();
    let set32 = ctx.set_rows(cache, src, i32s).unwrap();
    let set64 = ctx.set_rows(cache2, src, i64s).unwrap();
    let copied = ctx.cast(src, IQ4_NL).unwrap();
    let (dk, n_kv, h, hkv, n_q) = (64i64, 40i64, 8i64, 2i64, 6i64);
    let q = ctx.new_tensor(F32, &[dk, n_q, h, 1]).unwrap();
    let kc = ctx.new_tensor(IQ4_NL, &[dk, n_kv, hkv, 1]).unwrap();
    let vc = ctx.new_tensor(IQ4_NL, &[dk, n_kv, hkv, 1]).unwrap();
    let mask = ctx.new_tensor(F16, &[n_kv, n_q, 1, 1]).unwrap();
    let fa = ctx.flash_attn_ext(q, kc, vc, Some(mask), 0.125, 0.0, 0.0).unwrap();
    let mut r = rng::Rng::new(31);
    let mut rows = rng::values(64 * 3, 47, 1.0, 0.0);
    rows[64..128].iter_mut().for_each(|v| *v = 0.0);
    let kv_bytes = |seed: u64| {
        let n = (dk * n_kv * hkv) as usize;
        let mut b = vec![0u8; IQ4_NL.row_size(n as i64).unwrap()];
        shardgraph::tensor::quant::quantize_chunk(IQ4_NL, &rng::values(n, seed, 1.0, 0.0), &mut b, 1, n).unwrap();
        b
    };
    let causal: Vec<u8> = (0..n_q * n_kv)
        .map(|i| if i % n_kv <= 34 + i / n_kv { -((i % 5) as f32) * 0.1 } else { f32::NEG_INFINITY })
        .flat_map(|v| shardgraph::tensor::quant::fp32_to_fp16_bits(v).to_le_bytes())
        .collect();
    let leafs = vec![
        (src, fixtures::f32_bytes(&rows)),
        (cache, quant_blocks::random_blocks(IQ4_NL, 12, &mut r)),
        (cache2, quant_blocks::random_blocks(IQ4_NL, 12, &mut r)),
        (i32s, [5i32, 0, 2].iter().flat_map(|x| x.to_le_bytes()).collect()),
        (i64s, [1i64, 4, 3].iter().flat_map(|x| x.to_le_bytes()).collect()),
        (q, fixtures::f32_bytes(&rng::values((dk * n_q * h) as usize, 53, 1.0, 0.0))),
        (kc, kv_bytes(59)),
        (vc, kv_bytes(61)),
        (mask, causal),
    ];
    let outs = [set32, set64, copied, fa];
    let before = d.stats().host_nodes;
    let want = fixtures::run_graph_bytes(cpu, &ctx, &leafs, &outs);
    let got = fixtures::run_graph_bytes(d, &ctx, &leafs, &outs);
    let name = &d.device().name;
    assert_eq!(d.stats().host_nodes, before, "IQ4_NL cache on {name}: nodes ran on the host");
    for i in 0..3 {
        assert_eq!(got[i], want[i], "IQ4_NL cache on {name}: output {i} (set_rows / cpy) differs from the CPU");
    }
    let e = nmse(&got[3], &want[3]);
    println!("cuda_backend: {name} flash_attn_ext IQ4_NL K/V: nmse {e:.1e} vs the CPU");
    assert!(e < 5e-4, "IQ4_NL flash_attn_ext on {name}: nmse {e:e}");
}

/// Speculative decoding on the `qwen35` hybrid target with its gated
/// delta-net layers on 2 CUDA devices (tensor split 1:1): MTP drafting with
/// device-side recurrent snapshots (each draft's last token spoilt, so
/// verification rejects it and the states roll back), and a DFlash2
/// drafter whose graphs run on the same devices, both give the tokens of
/// plain greedy decoding on one CPU device — what the examples check with
/// `--device .. --verify`. The permutation model's greedy tokens follow its
/// embedding and head whatever its layers do, so plain decoding on the
/// devices is also held to the CPU's logits (NMSE 1e-4), and a model of the
/// same shape with random weights (every layer moves the logits) to those
/// of one CPU device fed the same tokens (NMSE 1e-2, as `--verify` with a GPU).
#[test]
fn speculative_qwen35_on_cuda_devices_equals_cpu_greedy() {
    use shardgraph_models::dflash::{DflashDrafter, DflashHparams};
    use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen35_gguf_with, Weights};
    use shardgraph_models::mtp::MtpDrafter;
    use shardgraph_models::qwen35::Qwen35Session;
    use shardgraph_models::speculative::{generate, NoDraft, SpecParams};
    use shardgraph_models::step::Drafter;

    /// Wrong at the last token of every draft of two or more, so verify
    /// rejects it and the recurrent states roll back (from snapshots).
    struct Spoil<D>(D);
    impl<D: Drafter<Qwen35Session>> Drafter<Qwen35Session> for Spoil<D> {
        fn draft(&mut self, t: &mut Qwen35Session, last: i32, pos: i64, n: usize) -> shardgraph::Result<Vec<i32>> {
            let mut d = self.0.draft(t, last, pos, n)?;
            if d.len() >= 2 {
                let k = d.len() - 1;
                d[k] = (d[k] + 1) % 320;
            }
            Ok(d)
        }
        fn accept(
            &mut self,
            t: &mut Qwen35Session,
            batch: &[i32],
            start: i64,
            out: &shardgraph_models::step::StepOutput,
            kept: usize,
        ) -> shardgraph::Result<()> {
            self.0.accept(t, batch, start, out, kept)
        }
        fn taps(&self) -> Vec<usize> {
            self.0.taps()
        }
    }
    let Some(_) = devices(1) else { return };
    let dir = std::env::temp_dir().join(format!("shardgraph-cuda-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hp = shardgraph_models::qwen35::Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    let target = dir.join("qwen35.gguf");
    write_qwen35_gguf_with(&target, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 13, Weights::Permutation).unwrap();
    let dhp = DflashHparams {
        core: HparamsCore::qwen3(1, 256, 384, 6, 3, 32),
        target_layers: vec![1, hp.n_layer],
        target_hidden: 256,
        block_size: 4,
        mask_token: (hp.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    };
    let drafter = dir.join("dflash2.gguf");
    write_dflash_gguf_with(&drafter, &dhp, &TensorTypes::uniform(GgmlType::Q8_0), hp.n_vocab, 13, Weights::Permutation)
        .unwrap();
    let (prompt, n_gen, kv) = ([3, 14, 15, 92, 65, 35], 10, GgmlType::F16);
    let plain = {
        let mut s = Qwen35Session::load(&target, &devices::cpu(&[1.0]), kv, 40).unwrap();
        generate(&mut s, &mut NoDraft, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
    };
    let on_cuda = || {
        let devs = devices(2).unwrap();
        let devs = Devices::from_backends(devs.into_iter().map(|d| Arc::new(d) as Arc<dyn Backend>).collect()).unwrap();
        Qwen35Session::load(&target, &devs, kv, 40).unwrap()
    };
    {
        let mut cpu = Qwen35Session::load(&target, &devices::cpu(&[1.0]), kv, 40).unwrap();
        let (want, want_logits) = decode::generate(&mut cpu, &prompt, n_gen);
        let (got, logits) = decode::generate(&mut on_cuda(), &prompt, n_gen);
        let worst = logits.iter().zip(&want_logits).map(|(a, b)| nmse(a, b)).fold(0.0, f64::max);
        println!("plain qwen35 on 2 CUDA devices: {got:?}, logits NMSE {worst:.2e}");
        assert_eq!((&got, &want), (&plain, &plain), "plain greedy on CUDA devices and on the CPU");
        assert!(worst <= 1e-4, "plain qwen35 on 2 CUDA devices: logits NMSE {worst:.3e}");
        // The same model with random weights, whose every layer moves the
        // logits: one CPU device fed the tokens the CUDA devices chose.
        let random = dir.join("qwen35-random.gguf");
        write_qwen35_gguf_with(&random, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 13, Weights::Random).unwrap();
        let devs = devices(2).unwrap();
        let devs = Devices::from_backends(devs.into_iter().map(|d| Arc::new(d) as Arc<dyn Backend>).collect()).unwrap();
        let (got, logits) = decode::generate(&mut Qwen35Session::load(&random, &devs, kv, 40).unwrap(), &prompt, n_gen);
        let mut cpu = Qwen35Session::load(&random, &devices::cpu(&[1.0]), kv, 40).unwrap();
        let v = hp.n_vocab as usize;
        let mut want_logits = vec![cpu.decode(&prompt, &[], true).unwrap().logits.unwrap()];
        for &t in &got[..got.len() - 1] {
            want_logits.push(cpu.decode(&[t], &[], true).unwrap().logits.unwrap());
        }
        let errors: Vec<f64> =
            logits.iter().zip(&want_logits).map(|(a, b)| nmse(&a[a.len() - v..], &b[b.len() - v..])).collect();
        let shown: Vec<String> = errors.iter().map(|e| format!("{e:.2e}")).collect();
        println!("random-weights qwen35 on 2 CUDA devices, logits NMSE per step against one CPU device {shown:?}");
        assert_eq!(errors.len(), n_gen);
        assert!(errors.iter().all(|&e| e <= 1e-2), "random-weights qwen35 on 2 CUDA devices: logits NMSE {shown:?}");
    }
    let mut s = on_cuda();
    s.enable_snapshots(4).unwrap();
    let mut d = Spoil(MtpDrafter::new(&s, 0.0).unwrap());
    let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 3, n_min: 1 }).unwrap();
    println!("mtp (last draft token spoilt) on 2 CUDA devices: {tokens:?}, {st:?}");
    assert_eq!(tokens, plain, "MTP on CUDA devices: {st:?}");
    assert!(st.drafted > st.accepted && st.accepted > 0, "drafts both accepted and rejected: {st:?}");
    let mut s = on_cuda();
    let mut d = DflashDrafter::attach_gguf(&mut s, &drafter, kv, 0.0).unwrap();
    let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 3, n_min: 1 }).unwrap();
    println!("dflash2 on 2 CUDA devices: {tokens:?}, {st:?}");
    assert_eq!(tokens, plain, "DFlash2 on CUDA devices: {st:?}");
    assert!(st.drafted > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// NCCL (RCCL) is only chosen for CUDA (HIP) devices on distinct GPUs: for
/// virtual devices on one GPU (NCCL refuses two ranks on one GPU) and emulated ones
/// `NcclComm` is an error saying why, and the meta backend keeps its
/// device-to-device copies (no communicator set, activations on the devices).
#[test]
fn nccl_is_refused_for_virtual_and_emulated_devices() {
    use shardgraph::split::Devices;
    use shardgraph::split::NcclComm;
    let Some(devs) = devices(2) else { return };
    let devs: Vec<Arc<dyn Backend>> = devs.into_iter().map(|d| Arc::new(d) as Arc<dyn Backend>).collect();
    let e = NcclComm::for_backends(&devs).unwrap_err().to_string();
    assert!(e.contains("one rank per GPU") || e.contains("needs a real GPU"), "{e}");
    let exec = Devices::from_backends(devs).and_then(|d| d.executor()).unwrap();
    assert!(!exec.has_comm());
    assert!(exec.device_data());
    // CPU devices are not CUDA devices.
    let cpu: Vec<Arc<dyn Backend>> = (0..2)
        .map(|_| Arc::new(shardgraph::CpuBackend::new(Default::default()).unwrap()) as Arc<dyn Backend>)
        .collect();
    let e = NcclComm::for_backends(&cpu).unwrap_err().to_string();
    assert!(e.contains("needs GPU devices"), "{e}");
    assert!(!Devices::from_backends(cpu).and_then(|d| d.executor()).unwrap().device_data());
    // Emulated HIP devices: no RCCL either, device-to-device copies between them.
    #[cfg(feature = "cuda-emu")]
    {
        let hip: Vec<Arc<dyn Backend>> =
            (0..3).map(|_| Arc::new(CudaBackend::emulated_hip(1 << 30)) as Arc<dyn Backend>).collect();
        let e = NcclComm::for_backends(&hip).unwrap_err().to_string();
        assert!(e.contains("needs a real GPU"), "{e}");
        let exec = Devices::from_backends(hip).and_then(|d| d.executor()).unwrap();
        assert!(!exec.has_comm());
        assert!(exec.device_data());
    }
}
