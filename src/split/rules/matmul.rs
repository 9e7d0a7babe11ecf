//! Split rules of the matmul family (`ops/matmul.rs`): `mul_mat`;
//! `mul_mat_id` and `add_id` run replicated.

use super::{Candidate, Node};
use crate::ops::{ops_outside, Op};
use crate::split::state::{AxisSplit, SplitState};

/// The candidates of a matmul-family node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::MulMat => mul_mat(x, out),
        // Expert products and their bias: replicated only.
        Op::MulMatId | Op::AddId => {}
        // Not a matmul op: `Op::family` routes none here.
        ops_outside!(matmul) => {}
    }
}

/// `mul_mat` (src0 `[K, M, …]` weights, src1 `[K, N, …]`): rows M split
/// → output axis 0; both split on K alike → partial sums; columns N or
/// batch dims split → output split alike; linear in each factor.
fn mul_mat(x: &Node, out: &mut Vec<Candidate>) {
    let (a, b, cur) = (x.src[0], x.src[1], x.cur);
    let m = SplitState::Mirrored;
    let p = SplitState::partial();
    // Weights split on rows (M): output split on axis 0.
    if let SplitState::Split(s) = &cur[0] {
        if s.axis == 1 {
            let mut o = s.clone();
            o.axis = 0;
            out.push(Candidate::new(vec![cur[0].clone(), m.clone()], SplitState::Split(o)));
        }
    }
    // Both split on K with the same boundaries: partial sums.
    for st in [&cur[0], &cur[1]] {
        if let SplitState::Split(s) = st {
            if s.axis == 0 {
                out.push(Candidate::new(vec![st.clone(), st.clone()], p.clone()));
            }
        }
    }
    // Columns (N) split: output split on axis 1.
    if let SplitState::Split(s) = &cur[1] {
        if s.axis == 1 {
            out.push(Candidate::new(vec![m.clone(), cur[1].clone()], cur[1].clone()));
        }
        // Batch dims: heads split the same way on both (a broadcast over b by whole groups).
        if s.axis >= 2 && s.segments.len() == 1 && s.repeat == 1 {
            let ax = s.axis;
            if a.ne[ax] == b.ne[ax] {
                out.push(Candidate::new(vec![cur[1].clone(), cur[1].clone()], cur[1].clone()));
            } else if a.ne[ax] == 1 {
                out.push(Candidate::new(vec![m.clone(), cur[1].clone()], cur[1].clone()));
            } else if a.ne[ax] > 0 && b.ne[ax] > 0 && b.ne[ax] % a.ne[ax] == 0 {
                let g = b.ne[ax] / a.ne[ax];
                if s.segments[0].iter().all(|e| e % g == 0) {
                    let sa = AxisSplit {
                        axis: ax,
                        segments: vec![s.segments[0].iter().map(|e| e / g).collect()],
                        repeat: 1,
                    };
                    out.push(Candidate::new(vec![SplitState::Split(sa), cur[1].clone()], cur[1].clone()));
                }
            }
        }
    }
    // A product is linear in each factor: one partial factor times a mirrored one.
    if cur[0] == p {
        out.push(Candidate::new(vec![p.clone(), m.clone()], p.clone()));
    }
    if cur[1] == p {
        out.push(Candidate::new(vec![m.clone(), p.clone()], p.clone()));
    }
}
