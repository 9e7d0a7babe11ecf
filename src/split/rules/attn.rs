//! Split rules of the attention family (`ops/attn.rs`): `flash_attn_ext`.

use super::{Candidate, Node};
use crate::ops::{ops_outside, Op};
use crate::split::state::{AxisSplit, SplitState};

/// The candidates of an attention-family node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::FlashAttnExt { .. } => flash_attn_ext(x, out),
        // Not an attention op: `Op::family` routes none here.
        ops_outside!(attn) => {}
    }
}

/// The candidates of a `flash_attn_ext` node (q `[d, n_q, n_head, n_seq]`,
/// k/v `[d, n_kv, n_head_kv, n_seq]`, mask `[n_kv, n_q, …]`, sinks
/// `[n_head]`; the replicated candidate is added by the caller): queries
/// or sequences split (K/V whole or split by sequence alike), or heads
/// split with K/V split by whole GQA groups (not with ALiBi, whose slopes
/// depend on the global head index).
fn flash_attn_ext(x: &Node, out: &mut Vec<Candidate>) {
    let (t, src, cur) = (x.t, &x.src, x.cur);
    let (q, k) = (src[0], src[1]);
    let m = SplitState::Mirrored;
    // Queries (axis 1) or sequences (axis 3) split: K/V whole (or split by
    // sequence alike), the mask's rows split with the queries. Output
    // [d_v, n_head, n_q, n_seq]: queries land on axis 2.
    if let SplitState::Split(s) = &cur[0] {
        if s.axis == 1 || s.axis == 3 {
            let ax = s.axis;
            let mut ins = vec![cur[0].clone()];
            let kv = if ax == 3 && k.ne[3] == q.ne[3] { cur[0].clone() } else { m.clone() };
            ins.push(kv.clone());
            ins.push(kv);
            let mut ok = !(ax == 3 && k.ne[3] != q.ne[3] && k.ne[3] != 1);
            for (i, extra) in src[3..].iter().enumerate() {
                // src[3] is the mask [n_kv, n_q, ...]; later ones (sinks) are per head.
                let st = match (i, ax) {
                    (0, 1) if extra.ne[1] == q.ne[1] => Some(cur[0].clone()),
                    (0, 1) => None,
                    (0, _) if extra.ne[3] == 1 => Some(m.clone()),
                    (0, _) if extra.ne[3] == q.ne[3] => Some(cur[0].clone()),
                    (0, _) => None,
                    _ => Some(m.clone()),
                };
                ok &= st.is_some();
                ins.push(st.unwrap_or(SplitState::Mirrored));
            }
            if ok {
                let o = AxisSplit { axis: if ax == 1 { 2 } else { 3 }, ..s.clone() };
                out.push(Candidate::new(ins, SplitState::Split(o)));
            }
        }
    }
    // ALiBi slopes depend on the global head index.
    if t.op.has_alibi() {
        return;
    }
    let SplitState::Split(s) = &cur[0] else { return };
    if s.axis != 2 || s.segments.len() != 1 || s.repeat != 1 {
        return;
    }
    let (h, hkv) = (q.ne[2], k.ne[2]);
    if hkv <= 0 || h % hkv != 0 {
        return;
    }
    let g = h / hkv;
    if g == 0 {
        return;
    }
    let m = SplitState::Mirrored;
    let mut kv = None;
    if s.segments[0].iter().all(|e| e % g == 0) {
        kv = Some(SplitState::Split(AxisSplit {
            axis: 2,
            segments: vec![s.segments[0].iter().map(|e| e / g).collect()],
            repeat: 1,
        }));
    } else if hkv == 1 {
        // One KV head: every Q head reads it, so K/V stay mirrored.
        kv = Some(m.clone());
    }
    let Some(kv) = kv else { return };
    let mut ins = vec![cur[0].clone(), kv.clone(), kv];
    // The mask is per query position, not per head, when it broadcasts over
    // heads; the sinks (src4, one per head) split with the heads.
    for (i, extra) in src[3..].iter().enumerate() {
        if i == 1 {
            if extra.ne[0] != h {
                return;
            }
            ins.push(SplitState::Split(AxisSplit { axis: 0, ..s.clone() }));
            continue;
        }
        if extra.ne[2] != 1 {
            return;
        }
        ins.push(m.clone());
    }
    out.push(Candidate::new(ins, SplitState::Split(AxisSplit { axis: 1, ..s.clone() })));
}
