//! Bad input through the public API gets an `Err`, never a panic or UB
//! (regressions from a newcomer's attempts to break the crate).

use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::{Backend, Context, CpuBackend, CpuConfig, Error, GgmlType, TensorStorage};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::types::TensorTypes;

#[test]
fn views_with_overflowing_strides_are_rejected() {
    let mut c = Context::new();
    let a = c.new_tensor_1d(GgmlType::F32, 8).unwrap();
    assert!(matches!(c.view_2d(a, 1, 2, usize::MAX - 2, 0), Err(Error::OutOfBounds { .. })));
    assert!(matches!(c.view_2d(a, 1, 3, 1 << 63, 0), Err(Error::OutOfBounds { .. })));
    // An empty view still needs its offset inside the source.
    assert!(c.view_1d(a, 0, 1 << 40).is_err());
    assert!(c.view_1d(a, 0, 32).is_ok());
}

#[test]
fn views_at_odd_byte_offsets_compute() {
    // F32 rows starting 1 byte into the buffer, 17-byte row stride: kernels
    // must not assume aligned typed access.
    let mut c = Context::new();
    let f = c.new_tensor_1d(GgmlType::F32, 64).unwrap();
    let fv = c.view_2d(f, 4, 3, 17, 1).unwrap();
    let s = c.sqr(fv).unwrap();
    let cpu = CpuBackend::with_threads(2).unwrap();
    let g = c.build_forward(&[s]).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(&cpu, &c, g.leafs()).unwrap();
    st.set_f32(&c, f, &(0..64).map(|i| 1.0 + i as f32 * 0.25).collect::<Vec<_>>()).unwrap();
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &c, &g, &mut st).unwrap();
    cpu.compute(&c, &g, &st).unwrap();
    let input = st.get_f32(&c, fv).unwrap();
    let want: Vec<f32> = input.iter().map(|x| x * x).collect();
    let got = st.get_f32(&c, s).unwrap();
    assert_eq!(got.len(), 12);
    for (a, b) in got.iter().zip(&want) {
        assert!(a == b || (a.is_nan() && b.is_nan()));
    }
}

#[test]
fn sizes_that_overflow_are_errors() {
    assert!(GgmlType::F32.row_size(i64::MAX).is_err());
    let mut c = Context::new();
    let a = c.new_tensor_1d(GgmlType::F32, 1 << 30).unwrap();
    let e = c.repeat_4d(a, 1 << 30, 1 << 30, 1, 1).unwrap_err();
    assert!(e.to_string().contains("repeat"), "{e}");
}

#[test]
fn thread_counts_are_bounded() {
    assert!(CpuBackend::with_threads(0).is_err());
    assert!(CpuBackend::new(CpuConfig { n_threads: 1 << 40, ..CpuConfig::default() }).is_err());
}

#[test]
fn concurrent_computes_on_one_storage_serialise() {
    // Two threads computing the same graph into the same buffers must not race.
    let mut c = Context::new();
    let a = c.new_tensor_1d(GgmlType::F32, 1 << 16).unwrap();
    let mut x = a;
    for _ in 0..8 {
        x = c.scale_bias(x, 1.0, 1.0).unwrap();
    }
    c.set_output(x).unwrap();
    let g = c.build_forward(&[x]).unwrap();
    let cpu = CpuBackend::with_threads(1).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(&cpu, &c, g.leafs()).unwrap();
    st.set_f32(&c, a, &vec![0.0; 1 << 16]).unwrap();
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &c, &g, &mut st).unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| cpu.compute(&c, &g, &st).unwrap());
        }
    });
    assert!(st.get_f32(&c, x).unwrap().iter().all(|&v| v == 8.0));
}

#[test]
fn graphs_built_before_a_truncate_are_errors() {
    use shardgraph::graph::alloc::GraphAllocator;
    use shardgraph::split::{Devices, Planner, SplitPolicy, SplitStore};
    use shardgraph::{Backend, CpuBackend, TensorStorage};
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(GgmlType::F32, 4, 4).unwrap();
    let base = ctx.len();
    let x = ctx.new_tensor_2d(GgmlType::F32, 4, 2).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let stale = ctx.build_forward(&[y]).unwrap();
    let plan = Planner::default().plan(&ctx, &stale, &SplitPolicy::new(&[1.0, 1.0]).unwrap(), &[]);
    ctx.truncate(base);
    assert_eq!(ctx.len(), base);
    // The next step's graph reuses the indices with other shapes.
    let x = ctx.new_tensor_2d(GgmlType::F32, 4, 3).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let g = ctx.build_forward(&[y]).unwrap();
    let cpu = CpuBackend::with_threads(1).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(&cpu, &ctx, g.leafs()).unwrap();
    assert!(GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &stale, &mut st).is_err());
    assert!(cpu.compute(&ctx, &stale, &st).is_err());
    assert!(Planner::default().plan(&ctx, &stale, &SplitPolicy::new(&[1.0, 1.0]).unwrap(), &[]).is_err());
    if let Ok(plan) = plan {
        let mut store = SplitStore::new(2);
        assert!(Devices::cpu(2, 1)
            .and_then(|d| d.executor())
            .unwrap()
            .execute(&ctx, &stale, &plan, &mut store, &[y])
            .is_err());
    }
    // The fresh graph plans and runs; the store re-places the reused input index.
    let policy = SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("*", shardgraph::split::SplitSpec::Mirrored);
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let mut store = SplitStore::new(2);
    let rep =
        Devices::cpu(2, 1).and_then(|d| d.executor()).unwrap().execute(&ctx, &g, &plan, &mut store, &[y]).unwrap();
    assert_eq!(rep.outputs[0].bytes.len(), 4 * 3 * 4);
}

/// The model-level public functions refuse hyper-parameters that would
/// divide by zero or overflow, and the speculative loop refuses a target
/// that returns the wrong number of tokens — errors, not panics.
#[test]
fn model_functions_refuse_degenerate_parameters() {
    use shardgraph::GgmlType;
    use shardgraph_models::dflash::DflashHparams;
    use shardgraph_models::generate::{write_dflash_gguf_with, Weights};
    use shardgraph_models::policy::attention_granules;
    use shardgraph_models::qwen3::{qwen3_policy, Qwen3Hparams};
    use shardgraph_models::qwen35::qwen35_policy;
    use shardgraph_models::qwen35::Qwen35Hparams;
    use shardgraph_models::speculative::{generate, SpecParams};
    use shardgraph_models::step::StepOutput;
    use shardgraph_models::step::{Drafter, Target};
    let q3 = Qwen3Hparams {
        core: HparamsCore {
            n_layer: 1,
            n_embd: 64,
            n_ff: 128,
            n_head: 4,
            n_head_kv: 0,
            head_dim: 16,
            rms_eps: 1e-6,
            rope_base: 1e4,
        },
        n_vocab: 32,
        n_ctx_train: 64,
    };
    assert!(qwen3_policy(&q3, &TensorTypes::uniform(GgmlType::F32), &[1.0, 1.0]).is_err());
    let _ = attention_granules(&q3, GgmlType::Q8_0, 2); // no division by zero
    let q35 = Qwen35Hparams {
        core: HparamsCore {
            n_layer: 2,
            n_embd: 64,
            n_ff: 128,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            rms_eps: 1e-6,
            rope_base: 1e4,
        },
        n_vocab: 32,
        n_rot: 8,
        rope_sections: [2, 1, 1, 0],
        full_attention_interval: 2,
        d_conv: 4,
        d_state: 16,
        n_k_heads: 0,
        n_v_heads: 4,
        n_nextn: 0,
        n_ctx_train: 64,
    };
    assert!(qwen35_policy(&q35, &TensorTypes::uniform(GgmlType::F32), &[1.0, 1.0]).is_err());
    let huge = Qwen35Hparams { n_k_heads: 1 << 30, n_v_heads: 1 << 31, d_state: 1 << 30, ..q35 };
    assert!(huge.validate().is_err());
    let dhp = DflashHparams {
        core: HparamsCore {
            n_layer: 1,
            n_embd: 64,
            n_ff: 64,
            n_head: 4,
            n_head_kv: 0,
            head_dim: 16,
            rms_eps: 1e-6,
            rope_base: 1e4,
        },
        target_layers: vec![1],
        target_hidden: 64,
        block_size: 4,
        mask_token: 31,
        conv: None,
        selector: Some((8, 4)),
    };
    let path = std::env::temp_dir().join(format!("shardgraph-bad-dflash-{}.gguf", std::process::id()));
    assert!(
        write_dflash_gguf_with(&path, &dhp, &TensorTypes::uniform(GgmlType::F32), 32, 1, Weights::Permutation).is_err()
    );
    let _ = std::fs::remove_file(&path);

    /// A target that returns one greedy token whatever the batch.
    struct Liar(i64);
    impl Target for Liar {
        fn n_past(&self) -> i64 {
            self.0
        }
        fn decode(&mut self, t: &[i32], _: &[usize], _: bool) -> shardgraph::Result<StepOutput> {
            self.0 += t.len() as i64;
            Ok(StepOutput { argmax: vec![1], ..Default::default() })
        }
        fn rollback(&mut self, n: i64) -> shardgraph::Result<()> {
            self.0 = n;
            Ok(())
        }
    }
    struct Two;
    impl Drafter<Liar> for Two {
        fn draft(&mut self, _: &mut Liar, _: i32, _: i64, _: usize) -> shardgraph::Result<Vec<i32>> {
            Ok(vec![1, 1])
        }
    }
    let e = generate(&mut Liar(0), &mut Two, &[1, 2], 8, SpecParams { n_max: 2, n_min: 0 }).unwrap_err();
    assert!(e.to_string().contains("greedy tokens"), "{e}");
}

#[test]
fn corrupt_counts_and_overflowing_splits_are_errors() {
    use shardgraph::gguf::{GgufFile, GgufWriter};
    use shardgraph::split::{slice_local, AxisSplit, Planner, SplitPolicy, SplitSpec, SplitState};
    use shardgraph_models::dflash::best_path;
    use shardgraph_models::qwen3::Qwen3Hparams;
    // A file's block_count is checked before any layer is created.
    let hp = Qwen3Hparams {
        core: HparamsCore { n_layer: 10_000_000, ..Qwen3Hparams::qwen3_8b().core },
        ..Qwen3Hparams::qwen3_8b()
    };
    let mut w = GgufWriter::new();
    hp.add_to_gguf(&mut w, "corrupt").unwrap();
    let bytes = w.write_to(Vec::new(), |_, _| Ok(())).unwrap();
    let f = GgufFile::from_bytes(bytes, "corrupt.gguf").unwrap();
    let e = Qwen3Hparams::from_gguf(&f).unwrap_err();
    assert!(e.to_string().contains("qwen3.block_count = 10000000 is outside 1..=512"), "{e}");

    // Split extents that overflow i64: errors, not arithmetic panics.
    let s = AxisSplit { axis: 1, segments: vec![vec![i64::MAX; 4]], repeat: i64::MAX };
    assert!(s.validate(i64::MAX, 4).is_err());
    assert_eq!(s.ranges(1), vec![]);
    let s = AxisSplit { axis: 1, segments: vec![vec![i64::MAX, 1]], repeat: 1 };
    assert!(s.validate(i64::MAX, 2).is_err());
    assert_eq!(s.ranges(1), vec![]);
    assert!(slice_local(GgmlType::F32, [1, 1 << 40, 1 << 40, 1 << 40], &[], &SplitState::Mirrored, 0).is_err());
    assert!(slice_local(GgmlType::F32, [4, -2, 1, 1], &[], &SplitState::Mirrored, 0).is_err());

    let mut ctx = Context::new();
    let a = ctx.new_tensor(GgmlType::F32, &[8, 6]).unwrap();
    ctx.set_name(a, "a").unwrap();
    ctx.set_input(a).unwrap();
    let b = ctx.scale(a, 2.0).unwrap();
    let g = ctx.build_forward(&[b]).unwrap();
    let policy = SplitPolicy::new(&[1.0, 1.0])
        .unwrap()
        .rule("a", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![i64::MAX, i64::MAX] });
    let e = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap_err();
    assert!(e.to_string().contains("do not sum to the axis length"), "{e}");

    // Every link value is checked (a NaN local bandwidth included).
    let mut planner = Planner::default();
    planner.link.local_bandwidth = f64::NAN;
    let plain = SplitPolicy::new(&[1.0, 1.0]).unwrap();
    let e = planner.plan(&ctx, &g, &plain, &[]).unwrap_err();
    assert!(e.to_string().contains("link model"), "{e}");

    // Sizes that overflow a slice index end the path instead of panicking.
    assert_eq!(best_path(&[0.0; 16], usize::MAX, 2, 3, 0.0), Vec::<i32>::new());
    assert_eq!(best_path(&[0.0; 16], 4, usize::MAX, 3, 0.0), Vec::<i32>::new());
}

#[test]
fn executor_misuse_is_an_error() {
    use shardgraph::split::{Devices, Planner, SplitPolicy};
    let mut ctx = Context::new();
    let a = ctx.new_tensor(GgmlType::F32, &[8, 6]).unwrap();
    let other = ctx.new_tensor(GgmlType::F32, &[8, 6]).unwrap();
    ctx.set_input(a).unwrap();
    let b = ctx.scale(a, 2.0).unwrap();
    let g = ctx.build_forward(&[b]).unwrap();
    let plan = Planner::default().plan(&ctx, &g, &SplitPolicy::new(&[1.0, 1.0]).unwrap(), &[]).unwrap();
    let exec = Devices::cpu(2, 1).and_then(|d| d.executor()).unwrap();
    let full: Vec<u8> = (0..48).flat_map(|i| (i as f32).to_le_bytes()).collect();
    // Leaf data shorter than the leaf.
    let e = exec.run(&ctx, &g, &plan, &|_| Some(full[..3].to_vec()), &[b]).unwrap_err();
    assert!(e.to_string().contains("data is 3 bytes"), "{e}");
    // An output the graph does not compute.
    let e = exec.run(&ctx, &g, &plan, &|_| Some(full.clone()), &[other]).unwrap_err();
    assert!(e.to_string().contains("not in the graph"), "{e}");
    // The right input still runs, with real values.
    let out = exec.run(&ctx, &g, &plan, &|_| Some(full.clone()), &[b]).unwrap();
    let got: Vec<f32> = out[0].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got[..3], [0.0, 2.0, 4.0]);
    assert_eq!(got[47], 94.0);
}
