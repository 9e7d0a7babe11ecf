//! Several CPU backend instances in one process are independent devices:
//! their own buffers and thread pools, computing side by side, with tensor
//! copies between them (the virtual devices of the meta backend).

use shardgraph::backend::copy_tensor;
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};

#[test]
fn instances_compute_concurrently_and_copy_between_each_other() {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(GgmlType::Q8_0, 256, 64).unwrap();
    let x = ctx.new_tensor_2d(GgmlType::F32, 256, 5).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let p = ctx.soft_max(y).unwrap();
    let g = ctx.build_forward(&[p]).unwrap();

    let devices: Vec<CpuBackend> = (0..3).map(|i| CpuBackend::with_threads(1 + i % 2).unwrap()).collect();
    let names: std::collections::HashSet<String> = devices.iter().map(|d| d.device().name).collect();
    assert_eq!(names.len(), 3, "each instance is its own device");

    let wv: Vec<f32> = (0..256 * 64).map(|i| ((i * 7919) % 997) as f32 / 997.0 - 0.5).collect();
    let xv: Vec<f32> = (0..256 * 5).map(|i| ((i * 104729) % 1009) as f32 / 1009.0 - 0.5).collect();

    // Device 0 gets the data from the host; devices 1 and 2 get it by copy.
    let mut storages: Vec<TensorStorage> = Vec::new();
    for d in &devices {
        let mut st = TensorStorage::new();
        st.alloc_tensors(d, &ctx, g.leafs()).unwrap();
        GraphAllocator::new(d.buffer_type()).alloc_graph(d, &ctx, &g, &mut st).unwrap();
        storages.push(st);
    }
    storages[0].set_f32(&ctx, w, &wv).unwrap();
    storages[0].set_f32(&ctx, x, &xv).unwrap();
    for j in 1..3 {
        for &l in g.leafs() {
            copy_tensor(&ctx, l, &storages[0], &storages[j]).unwrap();
        }
    }

    std::thread::scope(|s| {
        for (d, st) in devices.iter().zip(&storages) {
            let (ctx, g) = (&ctx, &g);
            s.spawn(move || d.compute(ctx, g, st).unwrap());
        }
    });
    let r0 = storages[0].get_f32(&ctx, p).unwrap();
    for st in &storages[1..] {
        assert_eq!(st.get_f32(&ctx, p).unwrap(), r0, "same graph, same bytes, same result on every device");
    }
    for col in r0.chunks(64) {
        assert!((col.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
    // Buffers are distinct memory.
    storages[1].set_f32(&ctx, x, &vec![0.0; 256 * 5]).unwrap();
    assert_eq!(storages[2].get_f32(&ctx, x).unwrap(), storages[0].get_f32(&ctx, x).unwrap());
}
