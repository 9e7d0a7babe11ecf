//! Split rules of the element-wise family (`ops/elementwise.rs`): unary
//! functions, `scale`, `clamp`, `fill`, the binary arithmetic and the GLUs.

use super::{keep_unary, Candidate, Node};
use crate::ops::{ops_outside, Op};
use crate::split::state::SplitState;

/// The candidates of an element-wise node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::Sqr | Op::Sqrt | Op::Unary(_) | Op::Clamp { .. } | Op::Scale { .. } | Op::Fill { .. } => keep_unary(x, out),
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary(x, out),
        Op::Glu { .. } if x.src.len() == 2 => {
            for st in &x.cur[..2] {
                if matches!(st, SplitState::Split(_)) && x.src[1].ne == x.src[0].ne {
                    out.push(Candidate::new(vec![st.clone(), st.clone()], st.clone()));
                }
            }
        }
        Op::Glu { .. } => fused_glu(x, out),
        // `add1`: replicated only (a scalar added to every element).
        Op::Add1 => {}
        // Not an element-wise op: `Op::family` routes none here.
        ops_outside!(elementwise) => {}
    }
}

/// `add`, `sub`, `mul`, `div`: a split of an axis both operands have (or
/// that the second broadcasts over) is kept; partial sums add, and a
/// partial sum times a mirrored factor stays partial.
fn binary(x: &Node, out: &mut Vec<Candidate>) {
    let (a, b) = (x.src[0], x.src[1]);
    let (m, p) = (SplitState::Mirrored, SplitState::partial());
    for st in [&x.cur[0], &x.cur[1]] {
        if let SplitState::Split(s) = st {
            let ax = s.axis;
            if a.ne[ax] != s.axis_len() {
                continue;
            }
            if b.ne[ax] == a.ne[ax] {
                out.push(Candidate::new(vec![st.clone(), st.clone()], st.clone()));
            } else if b.ne[ax] == 1 {
                out.push(Candidate::new(vec![st.clone(), m.clone()], st.clone()));
            }
        }
    }
    // Sums of partial sums (b may broadcast: each addend broadcasts alike).
    let any_partial = x.cur.contains(&p);
    if any_partial && (x.t.op == Op::Add || x.t.op == Op::Sub) {
        out.push(Candidate::new(vec![p.clone(), p.clone()], p.clone()));
    }
    // Scaling a partial sum by a mirrored factor is linear. (Division is
    // too, but x/0 on zero addends gives NaN where one device gives inf.)
    if x.t.op == Op::Mul {
        if x.cur[0] == p {
            out.push(Candidate::new(vec![p.clone(), m.clone()], p.clone()));
        }
        if x.cur[1] == p {
            out.push(Candidate::new(vec![m, p.clone()], p));
        }
    }
}

/// A fused GLU (src0 holds gate and up halves of each row).
fn fused_glu(x: &Node, out: &mut Vec<Candidate>) {
    if let SplitState::Split(s) = &x.cur[0] {
        if s.axis >= 1 {
            // Rows split: each row's gate and value halves stay together.
            out.push(Candidate::new(vec![x.cur[0].clone()], x.cur[0].clone()));
        } else if s.repeat == 1 && s.segments.len() == 2 && s.segments[0] == s.segments[1] {
            // A fused gate|up row split as two equal segments: device j
            // holds gate[j] then up[j], which glu pairs locally.
            out.push(Candidate::new(vec![x.cur[0].clone()], SplitState::split(0, s.segments[0].clone())));
        }
    }
}
