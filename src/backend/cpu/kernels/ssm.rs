//! CPU kernels of the recurrent-layer ops: `ssm_conv` (ggml's
//! `ggml_compute_forward_ssm_conv_f32`) and `gated_delta_net` (ggml's
//! `ggml_compute_forward_gated_delta_net_one_chunk`).

use super::attn::vec::VecOps;
use super::{unsupported, TView};
use crate::error::{Error, Result};
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType;
use rayon::prelude::*;

/// Channels per parallel task of `ssm_conv`.
const CONV_CHANNELS_PER_TASK: usize = 64;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match *op {
        Op::SsmConv => ssm_conv(op, dst, src),
        Op::GatedDeltaNet { k_snapshots } => gated_delta_net(op, dst, src, k_snapshots, false, &[]),
        // Not an ssm op: `kernels::compute` routes none here.
        ops_outside!(ssm) => Err(unsupported(op, dst, src)),
    }
}

fn with_reason(e: Error, why: &str) -> Error {
    match e {
        Error::UnsupportedOp { backend, op, detail } => {
            Error::UnsupportedOp { backend, op, detail: format!("{why}: {detail}") }
        }
        other => other,
    }
}

/// `dst[i, t, s] = Σ_j sx[t + j, i, s] · c[j, i]`, summed in order of `j`.
fn ssm_conv(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    let bad = |why: &str| with_reason(unsupported(op, dst, src), why);
    let (sx, c) = match src {
        [sx, c, ..] => (sx, c),
        _ => return Err(bad("needs sx and c")),
    };
    let (nc, d_inner) = (c.ne[0], c.ne[1]);
    let ncs = sx.ne[0];
    let (n_t, n_s) = (dst.ne[1], dst.ne[2]);
    if sx.ty != GgmlType::F32
        || c.ty != GgmlType::F32
        || dst.ty != GgmlType::F32
        || sx.ne[1] != d_inner
        || dst.ne[0] != d_inner
        || sx.ne[2] != n_s
        || ncs + 1 != nc + n_t
    {
        return Err(bad("operand shapes"));
    }
    let blocks: Vec<usize> = (0..d_inner).step_by(CONV_CHANNELS_PER_TASK).collect();
    blocks.par_iter().try_for_each_init(
        || (vec![0f32; ncs], vec![0f32; nc]),
        |(xs, cs), &i0| -> Result<()> {
            let i1 = (i0 + CONV_CHANNELS_PER_TASK).min(d_inner);
            for i in i0..i1 {
                c.load_row_f32(i, 0, 0, cs)?;
                for s in 0..n_s {
                    sx.load_row_f32(i, s, 0, xs)?;
                    for t in 0..n_t {
                        let mut sum = 0.0f32;
                        for (x, w) in xs[t..t + nc].iter().zip(cs.iter()) {
                            sum += x * w;
                        }
                        dst.set_f32(i, t, s, 0, sum);
                    }
                }
            }
            Ok(())
        },
    )
}

/// Sizes of a `gated_delta_net` call, read off its checked operands.
#[derive(Clone, Copy)]
struct GdnDims {
    /// Head size (`v.ne[0]`): the state of a head is `s_v × s_v`.
    s_v: usize,
    n_head: usize,
    n_tok: usize,
    n_seq: usize,
    /// State snapshots per (head, sequence): 1 keeps the final state only.
    n_snap: usize,
    /// One gate value per channel (`g.ne[0] == s_v`, KDA) rather than one
    /// per head and token.
    kda: bool,
}

/// Checks the operands of `gated_delta_net` (all F32, shapes as
/// `Context::gated_delta_net` makes them, `k_snapshots >= 1`) and returns
/// the sizes; the error says what is wrong.
fn gdn_dims(src: [&TView; 6], dst: &TView, k_snapshots: i64) -> std::result::Result<GdnDims, &'static str> {
    let [q, k, v, g, beta, state] = src;
    let [s_v, n_head, n_tok, n_seq] = v.ne;
    let n_snap = usize::try_from(k_snapshots).map_err(|_| "k_snapshots < 1")?;
    let kda = g.ne[0] == s_v && s_v != 1;
    let ok = [q, k, v, g, beta, state, dst].iter().all(|t| t.ty == GgmlType::F32)
        && n_snap >= 1
        && [q, k].iter().all(|t| {
            t.ne[0] == s_v
                && t.ne[2] == n_tok
                && t.ne[1] > 0
                && t.ne[3] > 0
                && n_head % t.ne[1] == 0
                && n_seq % t.ne[3] == 0
        })
        && (g.ne[0] == 1 || g.ne[0] == s_v)
        && g.ne[1..] == [n_head, n_tok, n_seq]
        && beta.ne == [1, n_head, n_tok, n_seq]
        && state.ne == [s_v, s_v, n_head, n_seq]
        && dst.is_contiguous()
        && Some(dst.ne[0]) == s_v.checked_mul(n_head)
        && n_snap.checked_mul(s_v).and_then(|x| x.checked_mul(n_seq)).and_then(|x| x.checked_add(n_tok * n_seq))
            == Some(dst.ne[1]);
    if !ok {
        return Err("operand shapes");
    }
    Ok(GdnDims { s_v, n_head, n_tok, n_seq, n_snap, kda })
}

/// One task's buffers: the state of a (head, sequence) pair and the rows of
/// the current token.
struct GdnScratch {
    /// `m[j·S + i] = S[i][j]`: row j of the stored state.
    m: Vec<f32>,
    qr: Vec<f32>,
    kr: Vec<f32>,
    vr: Vec<f32>,
    /// The token's gate row (KDA only), then its `exp`.
    gr: Vec<f32>,
    delta: Vec<f32>,
    out: Vec<f32>,
}

impl GdnScratch {
    fn new(s_v: usize, g_len: usize) -> Self {
        GdnScratch {
            m: vec![0f32; s_v * s_v],
            qr: vec![0f32; s_v],
            kr: vec![0f32; s_v],
            vr: vec![0f32; s_v],
            gr: vec![0f32; g_len],
            delta: vec![0f32; s_v],
            out: vec![0f32; s_v],
        }
    }
}

/// Everything a `gated_delta_net` task reads, and where it writes.
struct GdnRun<'a> {
    q: &'a TView,
    k: &'a TView,
    v: &'a TView,
    g: &'a TView,
    beta: &'a TView,
    state: &'a TView,
    /// The result seen as rows of `s_v` values: output row (b·T + t) holds
    /// head h at run (b·T + t)·H + h; snapshot slot `slot` of (h, b) starts
    /// at run T·B·H + slot·S·H·B + (b·H + h)·S.
    runs: TView,
    dims: GdnDims,
    /// Sequences per q / k sequence (q and k broadcast over sequences).
    rq3: usize,
    rk3: usize,
    scale: f32,
    ops: VecOps,
    /// The final state (one snapshot only) goes back into `state` instead
    /// of the result (see [`gated_delta_net_in_place`]).
    in_place: bool,
    /// Per snapshot slot, where its state goes instead of the result (each
    /// seen as rows of `s_v`, laid out as a slot of the result); empty:
    /// into the result (see [`gated_delta_net_direct`]).
    dests: &'a [Vec<TView>],
}

impl GdnRun<'_> {
    /// Writes state `m` of head `h`, sequence `b` to snapshot slot `slot`
    /// (in place: the final state into the state it was read from).
    fn write_state(&self, m: &[f32], slot: usize, h: usize, b: usize) -> Result<()> {
        let GdnDims { s_v, n_head, n_tok, n_seq, .. } = self.dims;
        if let Some(dests) = self.dests.get(slot) {
            // Task (h, b) writes only its own head's rows of each one.
            let base = (b * n_head + h) * s_v;
            for d in dests {
                for (j, row) in m.chunks_exact(s_v).enumerate() {
                    d.store_row_f32(base + j, 0, 0, row)?;
                }
            }
            return Ok(());
        }
        if self.in_place {
            // Task (h, b) read all of this head's state before its first token
            // and no other task touches it (invariant 3 of `access.rs`).
            for (j, row) in m.chunks_exact(s_v).enumerate() {
                self.state.store_row_f32(j, h, b, row)?;
            }
            return Ok(());
        }
        let out_runs = n_tok * n_seq * n_head;
        let snap_runs = s_v * n_head * n_seq;
        let base = out_runs + slot * snap_runs + (b * n_head + h) * s_v;
        for (j, row) in m.chunks_exact(s_v).enumerate() {
            self.runs.store_row_f32(base + j, 0, 0, row)?;
        }
        Ok(())
    }

    /// Token `t` of head `h`, sequence `b` (q and k rows `iq1`/`iq3`,
    /// `ik1`/`ik3`): decays the state by `exp(g)`, adds
    /// `β·(v − S·k)` along `k`, and writes the output row `S·q · scale`.
    /// Each row of the state goes through its two passes while it is in
    /// L1 (decay, then its `S·k` term; update, then its `S·q` term): a row's
    /// values depend only on that row, so this is the arithmetic of four
    /// whole-state passes, in the same order per row.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        sc: &mut GdnScratch,
        m: &mut [f32],
        t: usize,
        h: usize,
        b: usize,
        iq: (usize, usize),
        ik: (usize, usize),
    ) -> Result<()> {
        let (s_v, ops) = (self.dims.s_v, &self.ops);
        self.q.load_row_f32(iq.0, t, iq.1, &mut sc.qr)?;
        self.k.load_row_f32(ik.0, t, ik.1, &mut sc.kr)?;
        self.v.load_row_f32(h, t, b, &mut sc.vr)?;
        let beta_v = self.beta.get_f32(0, h, t, b);
        let decay = if self.dims.kda {
            self.g.load_row_f32(h, t, b, &mut sc.gr)?;
            sc.gr.iter_mut().for_each(|x| *x = x.exp());
            None
        } else {
            Some(self.g.get_f32(0, h, t, b).exp())
        };
        for (j, row) in m.chunks_exact_mut(s_v).enumerate() {
            match decay {
                Some(e) => (ops.scale)(row, e),
                None => row.iter_mut().zip(&sc.gr).for_each(|(x, e)| *x *= e),
            }
            sc.delta[j] = (sc.vr[j] - (ops.dot)(row, &sc.kr)) * beta_v;
        }
        for (j, row) in m.chunks_exact_mut(s_v).enumerate() {
            (ops.axpy)(row, &sc.kr, sc.delta[j]);
            sc.out[j] = (ops.dot)(row, &sc.qr) * self.scale;
        }
        self.runs.store_row_f32((b * self.dims.n_tok + t) * self.dims.n_head + h, 0, 0, &sc.out)
    }

    /// Task `ir` (head `ir % H`, sequence `ir / H`): loads its state, runs
    /// every token, and writes the snapshots (the states after the last
    /// `n_snap` tokens, newest in slot 0; with one snapshot, the final state).
    fn task(&self, sc: &mut GdnScratch, ir: usize) -> Result<()> {
        let GdnDims { s_v, n_head, n_tok, n_snap, .. } = self.dims;
        let (h, b) = (ir % n_head, ir / n_head);
        let iq = (h % self.q.ne[1], b / self.rq3);
        let ik = (h % self.k.ne[1], b / self.rk3);
        if self.in_place {
            // SAFETY: task (h, b) is the only one that reads or writes this
            // head's state (one task per pair, `gated_delta_net`), and the
            // op's other operands and its result lie in other memory (the
            // fusion runs in place only then: `fuse.rs`, `undisturbed`).
            if let Some(m) = unsafe { self.state.f32_rows_mut(0, h, b, s_v) } {
                // The state is updated where it lies: no copy in or out.
                for t in 0..n_tok {
                    self.step(sc, m, t, h, b, iq, ik)?;
                }
                return Ok(());
            }
        }
        let mut m = std::mem::take(&mut sc.m);
        for (j, row) in m.chunks_exact_mut(s_v).enumerate() {
            self.state.load_row_f32(j, h, b, row)?;
        }
        for t in 0..n_tok {
            self.step(sc, &mut m, t, h, b, iq, ik)?;
            if n_snap > 1 {
                let slot = n_tok - 1 - t;
                if slot < n_snap {
                    self.write_state(&m, slot, h, b)?;
                }
            }
        }
        if n_snap == 1 {
            self.write_state(&m, 0, h, b)?;
        }
        sc.m = m;
        Ok(())
    }
}

/// `gated_delta_net` with one snapshot whose final state is written back
/// into its state operand (`src[5]`, contiguous) rather than into the
/// result, whose state part is left unwritten: the CPU backend's fusion of
/// the op with the `cpy` of that state part into the same memory
/// (`cpu/fuse.rs`). The values are those the op and the copy write.
pub(crate) fn gated_delta_net_in_place(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match *op {
        Op::GatedDeltaNet { k_snapshots: 1 } if src.get(5).is_some_and(|s| s.is_contiguous()) => {
            gated_delta_net(op, dst, src, 1, true, &[])
        }
        _ => Err(with_reason(unsupported(op, dst, src), "in place: one snapshot, a contiguous state")),
    }
}

/// `gated_delta_net` with `k ≥ 2` snapshots whose slot `i` state is
/// written into each tensor of `dests[i]` (contiguous F32, one state's
/// bytes: a slot of the result as it would be laid out there) instead of
/// into the result, whose state part is left unwritten: the CPU backend's
/// fusion of the op with the copies of its slots into the caches that keep
/// them (`cpu/fuse.rs`; a verify batch's snapshots and the cache of the
/// final state). The values are those the op and the copies write.
///
/// # Errors
/// [`crate::Error::Unsupported`] for another op, `dests` of another length
/// or a destination that is not a contiguous F32 state; the op's own
/// errors.
pub(crate) fn gated_delta_net_direct(op: &Op, dst: &TView, src: &[TView], dests: &[Vec<TView>]) -> Result<()> {
    let bad = |why: &str| with_reason(unsupported(op, dst, src), why);
    let Op::GatedDeltaNet { k_snapshots } = *op else { return Err(bad("not gated_delta_net")) };
    let state = src.get(5).ok_or_else(|| bad("needs a state"))?;
    let (s_v, runs) = (state.ne[0], state.nelements() / state.ne[0].max(1));
    if k_snapshots < 2 || dests.len() as i64 != k_snapshots {
        return Err(bad("direct: one destination list per snapshot slot, two slots or more"));
    }
    let rows = dests
        .iter()
        .map(|ds| {
            ds.iter()
                .map(|d| {
                    if d.ty != GgmlType::F32 || !d.is_contiguous() || d.nelements() != state.nelements() {
                        return None;
                    }
                    d.with_layout(GgmlType::F32, [s_v, runs, 1, 1], [4, 4 * s_v, 4 * s_v * runs, 4 * s_v * runs])
                })
                .collect::<Option<Vec<_>>>()
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("direct: a destination is not a contiguous F32 state"))?;
    gated_delta_net(op, dst, src, k_snapshots, false, &rows)
}

/// The gated delta rule, one (head, sequence) pair per task; see
/// `Context::gated_delta_net` for the layout of the result (`in_place`:
/// see [`gated_delta_net_in_place`]).
fn gated_delta_net(
    op: &Op,
    dst: &TView,
    src: &[TView],
    k_snapshots: i64,
    in_place: bool,
    dests: &[Vec<TView>],
) -> Result<()> {
    let bad = |why: &str| with_reason(unsupported(op, dst, src), why);
    let (q, k, v, g, beta, state) = match src {
        [q, k, v, g, beta, state, ..] => (q, k, v, g, beta, state),
        _ => return Err(bad("needs q, k, v, g, beta, state")),
    };
    let dims = gdn_dims([q, k, v, g, beta, state], dst, k_snapshots).map_err(bad)?;
    let GdnDims { s_v, n_head, n_seq, .. } = dims;
    if s_v == 0 {
        return Ok(());
    }
    let n_runs = dst.ne[0] * dst.ne[1] / s_v;
    let runs = dst
        .with_layout(GgmlType::F32, [s_v, n_runs, 1, 1], [4, 4 * s_v, 4 * s_v * n_runs, 4 * s_v * n_runs])
        .ok_or_else(|| bad("result layout"))?;
    let run = GdnRun {
        q,
        k,
        v,
        g,
        beta,
        state,
        runs,
        dims,
        rq3: n_seq / q.ne[3],
        rk3: n_seq / k.ne[3],
        scale: 1.0 / (s_v as f32).sqrt(),
        ops: VecOps::detect(),
        in_place,
        dests,
    };
    (0..n_head * n_seq).into_par_iter().try_for_each_init(|| GdnScratch::new(s_v, g.ne[0]), |sc, ir| run.task(sc, ir))
}

#[cfg(test)]
mod tests {
    use super::super::attn::tests::run;
    use crate::{Context, GgmlType};

    fn rand_vec(seed: &mut u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                lo + (hi - lo) * ((*seed >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    #[test]
    fn ssm_conv_matches_reference() {
        let (d_conv, d_inner, n_t, n_s) = (4usize, 130usize, 3usize, 2usize);
        let ncs = d_conv - 1 + n_t;
        let mut ctx = Context::new();
        let sx = ctx.new_tensor_3d(GgmlType::F32, ncs as i64, d_inner as i64, n_s as i64).unwrap();
        let c = ctx.new_tensor_2d(GgmlType::F32, d_conv as i64, d_inner as i64).unwrap();
        let out = ctx.ssm_conv(sx, c).unwrap();
        let mut seed = 7;
        let xs = rand_vec(&mut seed, ncs * d_inner * n_s, -1.0, 1.0);
        let cs = rand_vec(&mut seed, d_conv * d_inner, -1.0, 1.0);
        let got = run(&ctx, &[(sx, xs.clone()), (c, cs.clone())], out, 2).unwrap();
        for s in 0..n_s {
            for t in 0..n_t {
                for i in 0..d_inner {
                    let mut want = 0f32;
                    for j in 0..d_conv {
                        want += xs[(s * d_inner + i) * ncs + t + j] * cs[i * d_conv + j];
                    }
                    assert_eq!(got[(s * n_t + t) * d_inner + i], want);
                }
            }
        }
    }

    /// The documented recurrence in f64, head by head.
    #[test]
    fn gated_delta_net_matches_reference() {
        for &(s_v, h, h_qk, n_t, n_s, g_vec, k_snap) in &[
            (8usize, 4usize, 2usize, 5usize, 2usize, false, 3usize),
            (8, 2, 2, 3, 1, true, 1),
            (16, 2, 1, 2, 2, true, 4),
        ] {
            let mut ctx = Context::new();
            let q = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, h_qk as i64, n_t as i64, n_s as i64).unwrap();
            let k = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, h_qk as i64, n_t as i64, n_s as i64).unwrap();
            let v = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, h as i64, n_t as i64, n_s as i64).unwrap();
            let gw = if g_vec { s_v } else { 1 };
            let g = ctx.new_tensor_4d(GgmlType::F32, gw as i64, h as i64, n_t as i64, n_s as i64).unwrap();
            let beta = ctx.new_tensor_4d(GgmlType::F32, 1, h as i64, n_t as i64, n_s as i64).unwrap();
            let st = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, s_v as i64, h as i64, n_s as i64).unwrap();
            let out = ctx.gated_delta_net(q, k, v, g, beta, st, k_snap as i64).unwrap();
            let mut seed = 11 + s_v as u64;
            let a = 0.5;
            let qs = rand_vec(&mut seed, s_v * h_qk * n_t * n_s, -a, a);
            let ks = rand_vec(&mut seed, s_v * h_qk * n_t * n_s, -a, a);
            let vs = rand_vec(&mut seed, s_v * h * n_t * n_s, -1.0, 1.0);
            let gs = rand_vec(&mut seed, gw * h * n_t * n_s, -1.0, 0.0);
            let bs = rand_vec(&mut seed, h * n_t * n_s, 0.0, 1.0);
            let ss = rand_vec(&mut seed, s_v * s_v * h * n_s, -1.0, 1.0);
            let leafs = vec![
                (q, qs.clone()),
                (k, ks.clone()),
                (v, vs.clone()),
                (g, gs.clone()),
                (beta, bs.clone()),
                (st, ss.clone()),
            ];
            let got = run(&ctx, &leafs, out, 3).unwrap();
            let out_len = s_v * h * n_t * n_s;
            let snap = s_v * s_v * h * n_s;
            let (mut num, mut den) = (0f64, 0f64);
            let mut cmp = |got: f32, want: f64| {
                num += (got as f64 - want).powi(2);
                den += want * want;
            };
            for b in 0..n_s {
                for hh in 0..h {
                    let hq = hh % h_qk;
                    // S[i][j] = state[i + j·S].
                    let mut m: Vec<Vec<f64>> = (0..s_v)
                        .map(|i| (0..s_v).map(|j| ss[((b * h + hh) * s_v + j) * s_v + i] as f64).collect())
                        .collect();
                    for t in 0..n_t {
                        let row = |x: &[f32], heads: usize, hd: usize| -> Vec<f64> {
                            x[((b * n_t + t) * heads + hd) * s_v..][..s_v].iter().map(|&e| e as f64).collect()
                        };
                        let (qv, kv, vv) = (row(&qs, h_qk, hq), row(&ks, h_qk, hq), row(&vs, h, hh));
                        let gi = (b * n_t + t) * h + hh;
                        let bt = bs[gi] as f64;
                        for (i, mi) in m.iter_mut().enumerate() {
                            let e = if g_vec { gs[gi * s_v + i] } else { gs[gi] } as f64;
                            mi.iter_mut().for_each(|x| *x *= e.exp());
                        }
                        let delta: Vec<f64> =
                            (0..s_v).map(|j| bt * (vv[j] - (0..s_v).map(|i| m[i][j] * kv[i]).sum::<f64>())).collect();
                        for i in 0..s_v {
                            for j in 0..s_v {
                                m[i][j] += kv[i] * delta[j];
                            }
                        }
                        for j in 0..s_v {
                            let o = (0..s_v).map(|i| m[i][j] * qv[i]).sum::<f64>() / (s_v as f64).sqrt();
                            cmp(got[(b * n_t + t) * h * s_v + hh * s_v + j], o);
                        }
                        let slot = n_t - 1 - t;
                        if slot < k_snap {
                            for j in 0..s_v {
                                for i in 0..s_v {
                                    cmp(got[out_len + slot * snap + ((b * h + hh) * s_v + j) * s_v + i], m[i][j]);
                                }
                            }
                        }
                    }
                }
            }
            assert!(num / den < 1e-12, "nmse {:e}", num / den);
        }
    }

    /// The fused in-place kernel updates the state where it lies (aligned
    /// F32 rows lent by `TView::f32_rows_mut`) or, for a state it cannot
    /// borrow (here: at an odd byte offset), through scratch copies; both
    /// give the op's outputs and final state bit for bit, with scalar and
    /// per-column gates, and the state part of the result is left unwritten.
    #[test]
    fn gated_delta_net_in_place_equals_the_op_and_its_copy() {
        use super::{gated_delta_net, gated_delta_net_in_place};
        use crate::backend::cpu::access::TView;
        for &(s_v, h, n_t, n_s, g_vec) in &[(8usize, 2usize, 3usize, 2usize, false), (16, 3, 1, 1, true)] {
            let mut ctx = Context::new();
            let q = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, h as i64, n_t as i64, n_s as i64).unwrap();
            let k = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, h as i64, n_t as i64, n_s as i64).unwrap();
            let v = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, h as i64, n_t as i64, n_s as i64).unwrap();
            let gw = if g_vec { s_v } else { 1 };
            let g = ctx.new_tensor_4d(GgmlType::F32, gw as i64, h as i64, n_t as i64, n_s as i64).unwrap();
            let beta = ctx.new_tensor_4d(GgmlType::F32, 1, h as i64, n_t as i64, n_s as i64).unwrap();
            let st = ctx.new_tensor_4d(GgmlType::F32, s_v as i64, s_v as i64, h as i64, n_s as i64).unwrap();
            let out = ctx.gated_delta_net(q, k, v, g, beta, st, 1).unwrap();
            let mut seed = 5 + s_v as u64;
            let bytes = |x: Vec<f32>| -> Vec<u8> { x.iter().flat_map(|e| e.to_le_bytes()).collect() };
            let n_qk = s_v * h * n_t * n_s;
            let mut bufs: Vec<Vec<u8>> = vec![
                bytes(rand_vec(&mut seed, n_qk, -0.5, 0.5)),
                bytes(rand_vec(&mut seed, n_qk, -0.5, 0.5)),
                bytes(rand_vec(&mut seed, n_qk, -1.0, 1.0)),
                bytes(rand_vec(&mut seed, gw * h * n_t * n_s, -1.0, 0.0)),
                bytes(rand_vec(&mut seed, h * n_t * n_s, 0.0, 1.0)),
            ];
            let state0 = bytes(rand_vec(&mut seed, s_v * s_v * h * n_s, -1.0, 1.0));
            let ids = [q, k, v, g, beta];
            let src_views = |bufs: &mut [Vec<u8>], state: *mut u8| -> Vec<TView> {
                let mut vs: Vec<TView> = ids
                    .iter()
                    .zip(bufs.iter_mut())
                    // SAFETY: each buffer holds its tensor's bytes and outlives the views.
                    .map(|(&id, b)| unsafe { TView::new(b.as_mut_ptr(), ctx.t(id)) })
                    .collect();
                // SAFETY: `state` points at the state's bytes (checked by the caller).
                vs.push(unsafe { TView::new(state, ctx.t(st)) });
                vs
            };
            let op = ctx.t(out).op.clone();
            let nbytes = ctx.t(out).nbytes();
            // The op: outputs, then the final state.
            let mut want = vec![0u8; nbytes];
            let mut s_copy = state0.clone();
            let srcs = src_views(&mut bufs, s_copy.as_mut_ptr());
            // SAFETY: `want` holds the result's bytes.
            let dst = unsafe { TView::new(want.as_mut_ptr(), ctx.t(out)) };
            gated_delta_net(&op, &dst, &srcs, 1, false, &[]).unwrap();
            let out_bytes = 4 * s_v * h * n_t * n_s;
            for offset in [0usize, 2] {
                let mut state = vec![0u8; state0.len() + offset];
                state[offset..].copy_from_slice(&state0);
                let mut got = vec![0xAB_u8; nbytes];
                let srcs = src_views(&mut bufs, state[offset..].as_mut_ptr());
                // SAFETY: `got` holds the result's bytes.
                let dst = unsafe { TView::new(got.as_mut_ptr(), ctx.t(out)) };
                // SAFETY: the slice is dropped at once; nothing else runs.
                let borrowable = unsafe { srcs[5].f32_rows_mut(0, 0, 0, s_v) }.is_some();
                assert_eq!(borrowable, offset == 0, "offset {offset}: the state is lent only when aligned");
                gated_delta_net_in_place(&op, &dst, &srcs).unwrap();
                assert_eq!(got[..out_bytes], want[..out_bytes], "offset {offset}: outputs");
                assert_eq!(state[offset..], want[out_bytes..], "offset {offset}: final state, in place");
                assert!(got[out_bytes..].iter().all(|&b| b == 0xAB), "offset {offset}: state part written");
            }
        }
    }
}
