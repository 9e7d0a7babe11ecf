//! Op dispatch of the CUDA backend: which `kernels-cuda` kernel computes a
//! node, with which launch shape and arguments. One file per op family
//! ([`OpFamily`], the same names as `ops/<family>.rs` and the CPU kernels);
//! [`run`] dispatches on [`Op::family`] with an exhaustive match. Each
//! family's `run` matches every op of its family (the others through
//! `ops_outside!`, no catch-all) and returns `Ok(false)` for a node it has
//! no kernel for (the backend then computes it on the host), and
//! `Ok(true)` once launched.
//!
//! The `.cu` files are not split by family; where each family's kernels
//! live ([`kernel_files`], which `kernels-cuda/README.md` repeats):
//!
//! | family | dispatch | kernels in `kernels-cuda/` |
//! | --- | --- | --- |
//! | elementwise | `elementwise.rs` | `elementwise.cu`, `glu.cu` |
//! | reduce | `reduce.rs` | `reduce.cu` (sum, sum_rows, mean, argsort), `softmax.cu` (argmax, top_k) |
//! | norm | `norm.rs` | `norm.cu`, `softmax.cu` (soft_max) |
//! | rope | `rope.rs` | `rope.cu` |
//! | matmul | `matmul.rs` | `quant_matvec.cu`, `mul_mat.cu` (incl. add_id), `getrows.cu` (dequantise), `elementwise.cu` (F16/BF16 activations to F32) |
//! | attn | `attn.rs` | `flash_attn.cu` |
//! | data | `data.rs` | `getrows.cu` (get_rows, set_rows), `elementwise.cu` (cpy, dup, cont), `concat_repeat_pad.cu` |
//! | ssm | `ssm.rs` | `ssm.cu` |
//! | distributed | `distributed.rs` | `distributed.cu` |
//!
//! The same code answers `supports_op` in a dry run ([`Cx::dry`]), where
//! nothing is launched and addresses are 0, so what is supported and what
//! runs cannot drift apart.
//!
//! Memory safety: [`Cx::launch`] is safe to call because every pointer the
//! dispatchers pass is an operand's address ([`T::p`]) whose whole span
//! (`nbytes`) the backend checked against its buffer, and the shapes and
//! strides passed with it are that operand's own `ne`/`nb` (or a
//! reinterpretation that stays inside the span), which is each kernel's
//! contract in its `.cu` file.

mod attn;
mod data;
mod distributed;
mod elementwise;
mod matmul;
mod norm;
mod reduce;
mod rope;
mod ssm;

use super::api::{DevPtr, Gpu, KArg};
use crate::error::Result;
use crate::ops::{Op, OpFamily};
use crate::tensor::{GgmlType, Tensor};
use std::cell::{Cell, RefCell};

/// A node operand: its tensor and device address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct T<'a> {
    /// The tensor (type, `ne`, `nb`).
    pub t: &'a Tensor,
    /// Device address of its first byte (0 in a dry run).
    pub p: DevPtr,
}

impl T<'_> {
    /// Element type.
    pub fn ty(&self) -> GgmlType {
        self.t.ty
    }
    /// The address as a kernel argument.
    pub fn ptr(&self) -> KArg {
        KArg::Ptr(self.p)
    }
    /// `ne[0..4]` as i64 arguments.
    pub fn ne(&self) -> [KArg; 4] {
        self.t.ne.map(KArg::I64)
    }
    /// `nb[0..4]` (bytes) as i64 arguments.
    pub fn nb(&self) -> [KArg; 4] {
        self.t.nb.map(|b| KArg::I64(b as i64))
    }
    /// Rows: `ne1·ne2·ne3`.
    pub fn nrows(&self) -> i64 {
        self.t.ne[1] * self.t.ne[2] * self.t.ne[3]
    }
    /// Element count.
    pub fn nelements(&self) -> i64 {
        self.t.nelements()
    }
}

/// Launch context: the device, and whether this is a dry run.
pub(crate) struct Cx<'a> {
    gpu: &'a dyn Gpu,
    dry: bool,
    sms: u32,
    /// Threads per warp/wave of the device (1 in a dry run).
    warp: u32,
    launches: Cell<u64>,
    /// Error flags of this compute ([`Cx::error_flag`]) and what each means.
    flags: RefCell<Option<Scratch<'a>>>,
    flag_what: RefCell<Vec<String>>,
    /// Zeroed flag buffers to take instead of allocating (queued computes).
    pool: Option<&'a std::sync::Mutex<Vec<DevPtr>>>,
}

/// Error flags per flag buffer (checked early when it fills).
pub(crate) const FLAG_SLOTS: usize = 1024;

impl<'a> Cx<'a> {
    /// A context that launches on `gpu`.
    pub fn live(gpu: &'a dyn Gpu) -> Self {
        let info = gpu.info();
        Cx {
            gpu,
            dry: false,
            sms: info.multiprocessors.max(1),
            warp: info.warp_size.max(1),
            launches: Cell::new(0),
            flags: RefCell::new(None),
            flag_what: RefCell::new(Vec::new()),
            pool: None,
        }
    }
    /// A context that launches on `gpu` and takes its error-flag buffer
    /// from `pool` (zeroed buffers of [`FLAG_SLOTS`] flags), handing it
    /// back with [`Cx::take_flags`] instead of freeing it.
    pub fn pooled(gpu: &'a dyn Gpu, pool: &'a std::sync::Mutex<Vec<DevPtr>>) -> Self {
        Cx { pool: Some(pool), ..Self::live(gpu) }
    }
    /// The flag buffer in use and what each flag handed out means, for a
    /// check after the queued work (the buffer is then the caller's).
    pub fn take_flags(&self) -> Option<(DevPtr, Vec<String>)> {
        let mut s = self.flags.borrow_mut().take()?;
        let p = std::mem::replace(&mut s.p, 0);
        Some((p, std::mem::take(&mut *self.flag_what.borrow_mut())))
    }
    /// A context that only answers whether a node has a kernel.
    pub fn dry(gpu: &'a dyn Gpu) -> Self {
        Cx {
            gpu,
            dry: true,
            sms: 1,
            warp: 1,
            launches: Cell::new(0),
            flags: RefCell::new(None),
            flag_what: RefCell::new(Vec::new()),
            pool: None,
        }
    }
    /// Launches issued so far.
    pub fn launches(&self) -> u64 {
        self.launches.get()
    }
    /// True in a dry run (nothing is launched).
    pub fn is_dry(&self) -> bool {
        self.dry
    }
    /// The most blocks worth launching for a grid-stride loop: enough to
    /// fill the device (32 per SM), not more.
    pub fn max_blocks(&self) -> u32 {
        self.sms.saturating_mul(32).max(1)
    }
    /// Blocks for `n` items at `per_block` items per block, capped by
    /// [`Cx::max_blocks`] and `limit` (CUDA's grid limits), at least 1.
    pub fn blocks(&self, n: i64, per_block: i64, limit: u32) -> u32 {
        let want = (n.max(1) + per_block.max(1) - 1) / per_block.max(1);
        want.clamp(1, self.max_blocks().min(limit) as i64) as u32
    }
    /// Launches `kernel` (see the module's safety argument).
    ///
    /// # Errors
    /// [`crate::Error::Compute`] for a block of several threads that is not
    /// a whole number of the device's warps/waves (the kernels' block
    /// reductions assume whole waves: 64 threads on AMD CDNA); the device's
    /// launch error.
    pub fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        if self.dry {
            return Ok(());
        }
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if threads > 1 && threads % self.warp as u64 != 0 {
            return Err(crate::Error::Compute {
                detail: format!(
                    "launch of {kernel}: a block of {threads} threads is not whole waves of {} threads",
                    self.warp
                ),
            });
        }
        self.launches.set(self.launches.get() + 1);
        // SAFETY: the module invariant: every pointer argument is a checked
        // operand address passed with that operand's own layout.
        unsafe { self.gpu.launch(kernel, grid, block, args) }
    }
    /// The device (for GEMM).
    pub fn gpu(&self) -> &dyn Gpu {
        self.gpu
    }
    /// `bytes` of zero-filled device memory for one node's launches, freed
    /// when the [`Scratch`] is dropped (stream-ordered on a GPU, so after the
    /// launches queued before). A dry run allocates nothing (address 0).
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] when the device is out of memory.
    pub fn scratch(&self, bytes: usize) -> Result<Scratch<'a>> {
        if self.dry {
            return Ok(Scratch { gpu: self.gpu, p: 0, bytes: 0 });
        }
        let p = self.gpu.alloc(bytes.max(1))?;
        Ok(Scratch { gpu: self.gpu, p, bytes: bytes.max(1) })
    }
    /// A 4-byte error flag for one launch's kernel to set (an index out of
    /// range), reported as [`crate::Error::Compute`] with `what` by
    /// [`Cx::check_flags`] after the graph's work has finished: one read per
    /// compute instead of a wait per flagged node. Address 0 in a dry run.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if the flag buffer cannot be allocated; a set
    /// flag found when the buffer is full and checked early.
    pub fn error_flag(&self, what: String) -> Result<KArg> {
        if self.dry {
            return Ok(KArg::Ptr(0));
        }
        if self.flag_what.borrow().len() == FLAG_SLOTS {
            self.check_flags()?;
            if let Some(f) = self.flags.borrow().as_ref() {
                // SAFETY: the whole flag allocation.
                unsafe { self.gpu.memset(f.p, 0, f.bytes)? };
            }
            self.flag_what.borrow_mut().clear();
        }
        if self.flags.borrow().is_none() {
            let pooled = self.pool.and_then(|p| p.lock().ok()?.pop());
            let s = match pooled {
                Some(p) => Scratch { gpu: self.gpu, p, bytes: 4 * FLAG_SLOTS },
                None => self.scratch(4 * FLAG_SLOTS)?,
            };
            *self.flags.borrow_mut() = Some(s);
        }
        let base = self.flags.borrow().as_ref().map_or(0, |f| f.p);
        let mut w = self.flag_what.borrow_mut();
        w.push(what);
        Ok(KArg::Ptr(base + 4 * (w.len() as DevPtr - 1)))
    }
    /// Reads every error flag handed out since the last check (after all
    /// queued work) and fails with the first set one's message.
    ///
    /// # Errors
    /// [`crate::Error::Compute`] naming the op and the bad operand.
    pub fn check_flags(&self) -> Result<()> {
        let w = self.flag_what.borrow();
        let flags = self.flags.borrow();
        let (Some(f), false) = (flags.as_ref(), w.is_empty()) else { return Ok(()) };
        let mut b = vec![0u8; 4 * w.len()];
        // SAFETY: the first 4·len bytes of the live flag allocation (len ≤ FLAG_SLOTS).
        unsafe { self.gpu.read(f.p, &mut b)? };
        match b.chunks_exact(4).position(|c| c != [0; 4]) {
            Some(i) => Err(crate::error::Error::Compute { detail: w[i].clone() }),
            None => Ok(()),
        }
    }
    /// Runs `g` with the device's GEMM library: `Ok(false)` when it has none
    /// (always in a dry run and in the emulator); the caller then launches
    /// its own kernels. Counted as a launch when it ran.
    pub fn gemm(&self, g: &super::api::Gemm) -> Result<bool> {
        if self.dry {
            return Ok(false);
        }
        // SAFETY: the module invariant: the matrices of `g` are checked
        // operands (or scratch allocations) described by their own layouts.
        let ran = unsafe { self.gpu().gemm(g)? };
        if ran {
            self.launches.set(self.launches.get() + 1);
        }
        Ok(ran)
    }
}

/// Device memory owned by one node's launches (a dequantised weight, an
/// error flag): see [`Cx::scratch`]. Its address joins the module's memory
/// argument: dispatchers pass it only with layouts inside its `bytes`.
pub(crate) struct Scratch<'a> {
    gpu: &'a dyn Gpu,
    p: DevPtr,
    bytes: usize,
}

impl Scratch<'_> {
    /// Its device address (0 in a dry run).
    pub fn p(&self) -> DevPtr {
        self.p
    }
    /// The address as a kernel argument.
    pub fn ptr(&self) -> KArg {
        KArg::Ptr(self.p)
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if self.p != 0 {
            // SAFETY: allocated by this device's `alloc` in `Cx::scratch`;
            // the Scratch is its only owner.
            unsafe { self.gpu.free(self.p) }
        }
    }
}

/// The kernel-name part of a storage type the kernels read (`f32`, `q4_K`,
/// …): one table for every kernel family that names kernels by type. Every
/// block type here has `get_rows`, `dequant`, `cpy` to F32/F16,
/// `get_rows_part` and matrix-vector kernels (`kernels-cuda/dequant.cuh`
/// decodes it).
pub(crate) fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    if let Some(s) = chunk_suffix(ty) {
        return Some(s);
    }
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        I32 => "i32",
        I64 => "i64",
        Q8_0 => "q8_0",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q2_K => "q2_K",
        Q3_K => "q3_K",
        Q4_K => "q4_K",
        Q5_K => "q5_K",
        Q6_K => "q6_K",
        _ => return None,
    })
}

/// [`type_suffix`] of a type whose values are floats (F32, F16, BF16 and
/// every block type): the weights of the matrix-vector and dequantising
/// kernels, the tables of `get_rows_part`.
pub(crate) fn float_suffix(ty: GgmlType) -> Option<&'static str> {
    type_suffix(ty).filter(|_| !matches!(ty, GgmlType::I32 | GgmlType::I64))
}

/// The kernel-name part of a block type that `kernels-cuda/dequant.cuh`
/// decodes eight values at a time (its `SG_CHUNK_TYPES`: ggml 0.25.3's IQ*,
/// TQ*, MXFP4, NVFP4, Q1_0 and Q2_0): their `get_rows` and `dequant` kernels
/// give each thread one chunk of 8 values ([`values_per_thread`]).
fn chunk_suffix(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        IQ2_XXS => "iq2_xxs",
        IQ2_XS => "iq2_xs",
        IQ2_S => "iq2_s",
        IQ3_XXS => "iq3_xxs",
        IQ3_S => "iq3_s",
        IQ1_S => "iq1_s",
        IQ1_M => "iq1_m",
        IQ4_NL => "iq4_nl",
        IQ4_XS => "iq4_xs",
        TQ1_0 => "tq1_0",
        TQ2_0 => "tq2_0",
        MXFP4 => "mxfp4",
        NVFP4 => "nvfp4",
        Q1_0 => "q1_0",
        Q2_0 => "q2_0",
        _ => return None,
    })
}

/// Values of a row each thread of a `get_rows` / `dequant` kernel of `ty`
/// writes (8 for the types decoded eight at a time, else 1): the grid's x
/// extent covers `ne00 / values_per_thread(ty)` threads.
pub(crate) fn values_per_thread(ty: GgmlType) -> i64 {
    if chunk_suffix(ty).is_some() {
        8
    } else {
        1
    }
}

/// The `kernels-cuda/` files whose kernels family `f`'s dispatch launches
/// (the table in the module doc).
pub(crate) fn kernel_files(f: OpFamily) -> &'static [&'static str] {
    match f {
        OpFamily::Elementwise => &["elementwise.cu", "glu.cu"],
        OpFamily::Reduce => &["reduce.cu", "softmax.cu"],
        OpFamily::Norm => &["norm.cu", "softmax.cu"],
        OpFamily::Rope => &["rope.cu"],
        OpFamily::Matmul => &["quant_matvec.cu", "mul_mat.cu", "getrows.cu", "elementwise.cu"],
        OpFamily::Attn => &["flash_attn.cu"],
        OpFamily::Data => &["getrows.cu", "elementwise.cu", "concat_repeat_pad.cu"],
        OpFamily::Ssm => &["ssm.cu"],
        OpFamily::Distributed => &["distributed.cu"],
    }
}

/// Launches the kernels for `op` computing `dst` from `src`; `Ok(false)` if
/// no kernel covers this node's types and layout.
pub(crate) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match op.family() {
        OpFamily::Elementwise => elementwise::run(cx, op, dst, src),
        OpFamily::Reduce => reduce::run(cx, op, dst, src),
        OpFamily::Norm => norm::run(cx, op, dst, src),
        OpFamily::Rope => rope::run(cx, op, dst, src),
        OpFamily::Matmul => matmul::run(cx, op, dst, src),
        OpFamily::Attn => attn::run(cx, op, dst, src),
        OpFamily::Data => data::run(cx, op, dst, src),
        OpFamily::Ssm => ssm::run(cx, op, dst, src),
        OpFamily::Distributed => distributed::run(cx, op, dst, src),
    }
}

#[cfg(test)]
mod tests {
    use super::kernel_files;
    use crate::backend::cuda::sources::KERNEL_SOURCES;
    use crate::ops::OpFamily;

    /// The dispatch source of each family, as compiled.
    fn dispatch_source(f: OpFamily) -> &'static str {
        match f {
            OpFamily::Elementwise => include_str!("elementwise.rs"),
            OpFamily::Reduce => include_str!("reduce.rs"),
            OpFamily::Norm => include_str!("norm.rs"),
            OpFamily::Rope => include_str!("rope.rs"),
            OpFamily::Matmul => include_str!("matmul.rs"),
            OpFamily::Attn => include_str!("attn.rs"),
            OpFamily::Data => include_str!("data.rs"),
            OpFamily::Ssm => include_str!("ssm.rs"),
            OpFamily::Distributed => include_str!("distributed.rs"),
        }
    }

    /// The source of `kernels-cuda/<file>`.
    fn cu(file: &str) -> &'static str {
        let stem = file.strip_suffix(".cu").unwrap_or(file);
        match KERNEL_SOURCES.iter().find(|(name, _)| *name == stem) {
            Some((_, src)) => src,
            None => panic!("kernels-cuda/{file} is not a kernel source"),
        }
    }

    /// The table names real files, every `.cu` file serves some family,
    /// and every kernel name (or name prefix, for names built with
    /// `format!`) a family's dispatch launches is in one of its files.
    #[test]
    fn kernel_files_cover_each_familys_launches() {
        for (name, _) in KERNEL_SOURCES {
            let file = format!("{name}.cu");
            assert!(OpFamily::ALL.iter().any(|&f| kernel_files(f).contains(&file.as_str())), "{file} in no family");
        }
        for f in OpFamily::ALL {
            let files: Vec<&str> = kernel_files(f).iter().map(|x| cu(x)).collect();
            let rs = dispatch_source(f);
            let mut launched = 0;
            for (i, _) in rs.match_indices("\"sg_") {
                let name: String = rs[i + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                assert!(
                    files.iter().any(|s| s.contains(&name)),
                    "{}.rs launches {name}, which is in none of {:?}",
                    f.name(),
                    kernel_files(f)
                );
                launched += 1;
            }
            assert!(launched > 0, "{}.rs names no kernel", f.name());
        }
    }
}
