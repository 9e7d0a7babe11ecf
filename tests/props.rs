//! Property tests (proptest): random sequences of op constructors over random
//! shapes and types. Properties:
//! 1. no constructor panics, whatever it is given (it returns `Ok` or `Err`);
//! 2. every `Ok` result has the shape (`ne`) ggml 0.15.3 gives for the same
//!    op on the same operands (checked by rebuilding the node in ggml; without
//!    the oracle this property is skipped with a message, and fails when
//!    `SHARDGRAPH_REQUIRE_GGML` is set: `common/require.rs`);
//! 3. the graph of all accepted nodes builds, allocates and computes on the
//!    CPU backend without panicking (errors such as out-of-range indices are
//!    allowed; panics are not).
//!
//! The random graphs (`common/random_graph.rs`) cover F32, F16, BF16, I32,
//! I64 and quantized (Q8_0, Q4_0, Q4_K, Q6_K) leafs and the ops the models
//! use; `every_generator_arm_builds_and_computes` checks that each arm of
//! the generator builds graphs the constructors accept and that compute.
//! The split properties over the same random graphs are in `split_props.rs`.
//! Each run draws its seed and prints it (shown with a failure);
//! `PROPTEST_RNG_SEED=<seed>` reruns those cases and `PROPTEST_CASES` sets
//! their number (default 2048, about a second).

#[path = "ggml_diff/oracle.rs"]
mod oracle;
#[path = "common/random_graph.rs"]
mod random_graph;
#[path = "common/require.rs"]
mod require;

use proptest::prelude::*;
use random_graph::{build, leaf_strategy, Leaf, Step};
use shardgraph::{Context, GgmlType};

/// The ggml oracle, or `None` after saying once that property 2 is skipped
/// (a failure, in every case, when `SHARDGRAPH_REQUIRE_GGML` is set).
fn oracle_or_skip() -> Option<&'static oracle::Ggml> {
    static SAID: std::sync::Once = std::sync::Once::new();
    match oracle::Ggml::get() {
        Ok(g) => Some(g),
        Err(why) if require::Tool::Ggml.required() => {
            require::missing(require::Tool::Ggml, "props: shapes against ggml (property 2)", &why);
            None
        }
        Err(why) => {
            SAID.call_once(|| require::missing(require::Tool::Ggml, "props: shapes against ggml (property 2)", &why));
            None
        }
    }
}

fn check_sequence(leafs: &[Leaf], steps: &[Step]) -> Result<(), TestCaseError> {
    let Some((ctx, accepted)) = build(leafs, steps) else { return Ok(()) };

    // Property 2: ggml gives the same shapes.
    if let Some(g) = oracle_or_skip() {
        let gc = g.init_no_alloc(64 << 20);
        let mut map: Vec<oracle::P> = vec![std::ptr::null_mut(); ctx.len()];
        for id in ctx.ids() {
            let t = ctx.tensor(id).unwrap().clone();
            let gt = if matches!(t.op, shardgraph::Op::None) {
                gc.new_tensor(t.ty.id(), t.ne)
            } else {
                let srcs: Vec<oracle::P> = t.src.iter().map(|s| map[s.index()]).collect();
                // ggml's constructors are not defined on empty operands (some
                // divide by a zero extent); those nodes, and nodes built on
                // them, are checked by properties 1 and 3 only.
                let empty = t.src.iter().any(|s| ctx.tensor(*s).unwrap().nelements() == 0);
                if empty || srcs.iter().any(|p| p.is_null()) {
                    continue;
                }
                // ggml bounds-checks a view by its contiguous size
                // (row size × rows) rather than its strided span, so it
                // rejects some strided views that fit; those are ours alone.
                if matches!(t.op, shardgraph::Op::View) {
                    let base = ctx.tensor(t.src[0]).unwrap();
                    let rel = t.view_offs - if base.view_src.is_some() { base.view_offs } else { 0 };
                    let contiguous = t.ty.row_size(t.ne[0]).unwrap() * (t.ne[1] * t.ne[2] * t.ne[3]) as usize;
                    if rel + contiguous > base.nbytes() {
                        continue;
                    }
                }
                // Logged so a ggml abort (we accepted what ggml rejects) names the node.
                eprintln!(
                    "props: ggml translate {} of {:?}",
                    t.op.name(),
                    t.src.iter().map(|s| ctx.tensor(*s).unwrap().describe()).collect::<Vec<_>>()
                );
                gc.translate(&ctx, &t, &srcs)
            };
            let (gne, _) = oracle::ggml_layout(gt);
            prop_assert_eq!(gne, t.ne, "shape of {} differs from ggml's", t.op.name());
            map[id.index()] = gt;
        }
    }

    if accepted.is_empty() {
        return Ok(());
    }
    let graph = ctx.build_forward(&accepted).map_err(|e| TestCaseError::fail(e.to_string()))?;

    // Property 3: compute does not panic (errors such as an index out of range are allowed).
    random_graph::compute_one_device(&ctx, &graph)?;

    Ok(())
}

proptest! {
    #![proptest_config(random_graph::config("props", 2048))]

    #[test]
    fn random_op_sequences(leafs in prop::collection::vec(leaf_strategy(), 1..5),
                           steps in prop::collection::vec(any::<Step>(), 1..24)) {
        check_sequence(&leafs, &steps)?;
    }
}

#[test]
fn foreign_and_out_of_range_handles_are_errors() {
    let mut a = Context::new();
    let mut b = Context::new();
    let x = a.new_tensor_1d(GgmlType::F32, 4).unwrap();
    let y = b.new_tensor_1d(GgmlType::F32, 4).unwrap();
    assert!(matches!(a.add(x, y), Err(shardgraph::Error::InvalidOperand { .. })));
    assert!(b.build_forward(&[x]).is_err());
    assert!(a.new_tensor(GgmlType::F32, &[]).is_err());
    assert!(a.new_tensor(GgmlType::F32, &[1, 2, 3, 4, 5]).is_err());
    assert!(a.new_tensor(GgmlType::F32, &[-1]).is_err());
    assert!(a.new_tensor(GgmlType::Q4_0, &[33]).is_err());
    assert!(a.new_tensor(GgmlType::F32, &[1 << 40, 1 << 20]).is_err());
}

/// Every arm of the random-graph generator builds nodes the constructors
/// accept, and graphs of them compute on one CPU device: over 64 random
/// steps of each arm on a pool of typical leafs (F32, F16, I32, Q8_0), each
/// arm is accepted in at least a quarter of its steps and computes
/// without error in at least one; the rates are printed.
#[test]
fn every_generator_arm_builds_and_computes() {
    let mut r: u64 = 0x5EED;
    let mut next = move || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r as u32
    };
    let leafs = [
        Leaf { ty: 0, ne: vec![4, 3, 2, 1] },
        Leaf { ty: 0, ne: vec![6, 2, 3, 2] },
        Leaf { ty: 0, ne: vec![2, 4, 3] },
        Leaf { ty: 6, ne: vec![4, 3, 2, 1] },
        Leaf { ty: 7, ne: vec![3] },
        Leaf { ty: 10, ne: vec![1, 3] },
    ];
    let mut weak = Vec::new();
    for kind in 0..random_graph::N_KINDS {
        let (mut accepted, mut computed) = (0, 0);
        for _ in 0..64 {
            let step = (kind, next(), next(), next());
            let Some((ctx, out)) = build(&leafs, &[step]) else { continue };
            if let [id] = out[..] {
                accepted += 1;
                let graph = ctx.build_forward(&[id]).unwrap();
                computed += usize::from(random_graph::compute_one_device(&ctx, &graph).unwrap().2);
            }
        }
        eprintln!("arm {kind:2}: {accepted:2} of 64 steps accepted, {computed:2} computed");
        if accepted < 16 || computed == 0 {
            weak.push((kind, accepted, computed));
        }
    }
    assert!(weak.is_empty(), "arms (kind, accepted of 64, computed) that rarely build or never compute: {weak:?}");
}
