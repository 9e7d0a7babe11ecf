//! Tensor parallelism over C: devices (`sg_devices_*`), the split policy
//! (`sg_policy_*`), plans (`sg_plan*`), the store of split tensors
//! (`sg_store_*`), the executor (`sg_executor_*`, `sg_execute`) and run
//! reports (`sg_report_*`), over [`shardgraph::split`].

use crate::graph::{sg_tensor, SgContext, SgGraph};
use crate::ptr;
use crate::status::{arg, run, sg_status, R};
use shardgraph::split::{Devices, MetaExecutor, Plan, Planner, RunReport, SplitPolicy, SplitSpec, SplitStore};
use shardgraph::{GgmlType, TensorId};
use std::ffi::c_char;

/// `sg_devices`: [`Devices`].
#[derive(Debug)]
pub struct SgDevices {
    /// The devices.
    pub(crate) devices: Devices,
}

/// `sg_policy`: a [`SplitPolicy`] (`None` only while a rule is being added).
#[derive(Debug)]
pub struct SgPolicy {
    policy: Option<SplitPolicy>,
}

/// `sg_plan`: a [`Plan`].
#[derive(Debug)]
pub struct SgPlan {
    plan: Plan,
}

/// `sg_store`: a [`SplitStore`].
#[derive(Debug)]
pub struct SgStore {
    store: SplitStore,
}

/// `sg_executor`: a [`MetaExecutor`].
#[derive(Debug)]
pub struct SgExecutor {
    exec: MetaExecutor,
}

/// `sg_report`: a [`RunReport`] with each output's type and shape.
#[derive(Debug)]
pub struct SgReport {
    report: RunReport,
    /// Per output: type and `ne`.
    layouts: Vec<(GgmlType, [i64; 4])>,
}

/// A device or thread count from C.
fn positive(n: i32, what: &str) -> R<usize> {
    if n < 1 {
        return arg(format!("{what} = {n}: need at least 1"));
    }
    Ok(n as usize)
}

/// Writes `v` to `*p` unless `p` is NULL.
fn write_opt<T>(p: *mut T, v: T, what: &str) -> R {
    if !p.is_null() {
        ptr::slot(p, what)?.write(v);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------

/// `sg_devices_cpu`: `n` CPU devices with `threads` worker threads each
/// ([`Devices::cpu`]).
#[no_mangle]
pub extern "C" fn sg_devices_cpu(n: i32, threads: i32, out: *mut *mut SgDevices) -> sg_status {
    run("sg_devices_cpu", || {
        let out = ptr::slot(out, "devs")?;
        let devices = Devices::cpu(positive(n, "n")?, positive(threads, "threads")?)?;
        out.write(ptr::into_handle(SgDevices { devices }));
        Ok(())
    })
}

/// `sg_devices_open`: the devices a comma-separated list names
/// ([`Devices::parse`]: `CPU`, `CUDA<i>`, `HIP<i>`, `EMU`, `EMUHIP`).
#[no_mangle]
pub extern "C" fn sg_devices_open(names: *const c_char, threads: i32, out: *mut *mut SgDevices) -> sg_status {
    run("sg_devices_open", || {
        let out = ptr::slot(out, "devs")?;
        let names = ptr::string(names, "names")?;
        let devices = Devices::parse(names, positive(threads, "threads")?)?;
        out.write(ptr::into_handle(SgDevices { devices }));
        Ok(())
    })
}

/// `sg_devices_set_tensor_split`: the tensor-split ratios, one per device
/// ([`Devices::with_tensor_split`]); policies, stores and executors made
/// afterwards use them.
#[no_mangle]
pub extern "C" fn sg_devices_set_tensor_split(devs: *mut SgDevices, ratios: *const f32, n: usize) -> sg_status {
    run("sg_devices_set_tensor_split", || {
        let d = ptr::obj_mut(devs, "devs")?;
        let ratios = ptr::slice(ratios, n, "ratios")?;
        d.devices = d.devices.clone().with_tensor_split(ratios)?;
        Ok(())
    })
}

/// `sg_devices_count`: the number of devices.
#[no_mangle]
pub extern "C" fn sg_devices_count(devs: *const SgDevices, out: *mut usize) -> sg_status {
    run("sg_devices_count", || {
        let d = ptr::obj(devs, "devs")?;
        ptr::slot(out, "n")?.write(d.devices.n_devices());
        Ok(())
    })
}

/// `sg_devices_name`: device `index`'s name (`CPU0`, `CUDA0.1`, …),
/// `snprintf`-like into `buf`.
#[no_mangle]
pub extern "C" fn sg_devices_name(
    devs: *const SgDevices,
    index: usize,
    buf: *mut c_char,
    buf_len: usize,
    needed: *mut usize,
) -> sg_status {
    run("sg_devices_name", || {
        let d = ptr::obj(devs, "devs")?;
        let names = d.devices.names();
        let Some(name) = names.get(index) else {
            return arg(format!("device index {index} of {} devices", names.len()));
        };
        let n = ptr::write_text(name, buf, buf_len, "buf")?;
        write_opt(needed, n, "needed")
    })
}

/// `sg_devices_free`: frees the devices (NULL: nothing). Executors,
/// stores and engines made from them keep the backends they need.
#[no_mangle]
pub extern "C" fn sg_devices_free(devs: *mut SgDevices) -> sg_status {
    run("sg_devices_free", || {
        ptr::free(devs);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Split policy
// ---------------------------------------------------------------------------

/// `sg_policy_new`: a policy over the devices with their ratios and no
/// rules ([`Devices::policy`]).
#[no_mangle]
pub extern "C" fn sg_policy_new(devs: *const SgDevices, out: *mut *mut SgPolicy) -> sg_status {
    run("sg_policy_new", || {
        let d = ptr::obj(devs, "devs")?;
        let out = ptr::slot(out, "pol")?;
        let policy = d.devices.policy()?;
        out.write(ptr::into_handle(SgPolicy { policy: Some(policy) }));
        Ok(())
    })
}

/// Adds rule `pattern` → `spec` to the policy.
fn add_rule(pol: *mut SgPolicy, pattern: *const c_char, spec: SplitSpec) -> R {
    let p = ptr::obj_mut(pol, "pol")?;
    let pattern = ptr::string(pattern, "pattern")?;
    let Some(policy) = p.policy.take() else {
        return arg("the policy was left unusable by an earlier panic");
    };
    p.policy = Some(policy.rule(pattern, spec));
    Ok(())
}

/// Checks an axis and a granule.
fn axis_granule(axis: i32, granule: i64) -> R<usize> {
    if !(0..=3).contains(&axis) {
        return arg(format!("axis {axis} is not 0..=3"));
    }
    if granule < 1 {
        return arg(format!("granule {granule} must be at least 1"));
    }
    Ok(axis as usize)
}

/// `sg_policy_rule_axis`: tensors named like `pattern` (`*` any run of
/// characters) split along `axis` on multiples of `granule` elements
/// ([`SplitSpec::Axis`] without segments).
#[no_mangle]
pub extern "C" fn sg_policy_rule_axis(
    pol: *mut SgPolicy,
    pattern: *const c_char,
    axis: i32,
    granule: i64,
) -> sg_status {
    run("sg_policy_rule_axis", || {
        let axis = axis_granule(axis, granule)?;
        add_rule(pol, pattern, SplitSpec::Axis { axis, granule, segments: Vec::new() })
    })
}

/// `sg_policy_rule_segments`: as `sg_policy_rule_axis` for a fused tensor
/// whose axis is `n_segments` parts of the given lengths (gate|up, Q|K|V),
/// each split on its own ([`SplitSpec::Axis`] with segments).
#[no_mangle]
pub extern "C" fn sg_policy_rule_segments(
    pol: *mut SgPolicy,
    pattern: *const c_char,
    axis: i32,
    granule: i64,
    segments: *const i64,
    n_segments: usize,
) -> sg_status {
    run("sg_policy_rule_segments", || {
        let axis = axis_granule(axis, granule)?;
        let segments = ptr::slice(segments, n_segments, "segments")?.to_vec();
        if segments.is_empty() {
            return arg("no segments (use sg_policy_rule_axis)");
        }
        add_rule(pol, pattern, SplitSpec::Axis { axis, granule, segments })
    })
}

/// `sg_policy_rule_mirrored`: tensors named like `pattern` are whole on
/// every device ([`SplitSpec::Mirrored`]).
#[no_mangle]
pub extern "C" fn sg_policy_rule_mirrored(pol: *mut SgPolicy, pattern: *const c_char) -> sg_status {
    run("sg_policy_rule_mirrored", || add_rule(pol, pattern, SplitSpec::Mirrored))
}

/// `sg_policy_keep_weights_split`: memory first (`keep` non-zero): the
/// planner does not gather a weight the policy splits
/// ([`SplitPolicy::keep_weights_split`](shardgraph::split::SplitPolicy::keep_weights_split)).
#[no_mangle]
pub extern "C" fn sg_policy_keep_weights_split(pol: *mut SgPolicy, keep: i32) -> sg_status {
    run("sg_policy_keep_weights_split", || {
        let p = ptr::obj_mut(pol, "pol")?;
        let Some(policy) = p.policy.take() else {
            return arg("the policy was left unusable by an earlier panic");
        };
        p.policy = Some(policy.keep_weights_split(keep != 0));
        Ok(())
    })
}

/// `sg_policy_free`: frees a policy (NULL: nothing).
#[no_mangle]
pub extern "C" fn sg_policy_free(pol: *mut SgPolicy) -> sg_status {
    run("sg_policy_free", || {
        ptr::free(pol);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------

/// `sg_plan_new`: plans `graph` of `ctx` under `pol` ([`Planner::plan`] with
/// the default link model; graph inputs no rule covers are mirrored).
#[no_mangle]
pub extern "C" fn sg_plan_new(
    ctx: *const SgContext,
    graph: *const SgGraph,
    pol: *const SgPolicy,
    out: *mut *mut SgPlan,
) -> sg_status {
    run("sg_plan_new", || {
        let c = ptr::obj(ctx, "ctx")?;
        let g = ptr::obj(graph, "graph")?;
        let p = ptr::obj(pol, "pol")?;
        let out = ptr::slot(out, "plan")?;
        g.check(c)?;
        let Some(policy) = p.policy.as_ref() else {
            return arg("the policy was left unusable by an earlier panic");
        };
        let plan = Planner::default().plan(&c.ctx, &g.graph, policy, &[])?;
        out.write(ptr::into_handle(SgPlan { plan }));
        Ok(())
    })
}

/// `sg_plan_describe`: the plan's text report ([`Plan::describe`]),
/// `snprintf`-like into `buf`.
#[no_mangle]
pub extern "C" fn sg_plan_describe(
    plan: *const SgPlan,
    ctx: *const SgContext,
    graph: *const SgGraph,
    buf: *mut c_char,
    buf_len: usize,
    needed: *mut usize,
) -> sg_status {
    run("sg_plan_describe", || {
        let p = ptr::obj(plan, "plan")?;
        let c = ptr::obj(ctx, "ctx")?;
        let g = ptr::obj(graph, "graph")?;
        g.check(c)?;
        let text = p.plan.describe(&c.ctx, &g.graph)?;
        let n = ptr::write_text(&text, buf, buf_len, "buf")?;
        write_opt(needed, n, "needed")
    })
}

/// `sg_plan_bytes_moved`: bytes all devices together receive per run of
/// the plan ([`Plan::total_bytes`]).
#[no_mangle]
pub extern "C" fn sg_plan_bytes_moved(plan: *const SgPlan, out: *mut u64) -> sg_status {
    run("sg_plan_bytes_moved", || {
        let p = ptr::obj(plan, "plan")?;
        ptr::slot(out, "bytes")?.write(p.plan.total_bytes());
        Ok(())
    })
}

/// `sg_plan_n_repartitions`: the number of repartitions (collectives and
/// distributed-row combines) in the plan.
#[no_mangle]
pub extern "C" fn sg_plan_n_repartitions(plan: *const SgPlan, out: *mut usize) -> sg_status {
    run("sg_plan_n_repartitions", || {
        let p = ptr::obj(plan, "plan")?;
        ptr::slot(out, "n")?.write(p.plan.repartitions.len());
        Ok(())
    })
}

/// `sg_plan_free`: frees a plan (NULL: nothing).
#[no_mangle]
pub extern "C" fn sg_plan_free(plan: *mut SgPlan) -> sg_status {
    run("sg_plan_free", || {
        ptr::free(plan);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Store
// ---------------------------------------------------------------------------

/// `sg_store_new`: an empty store for the devices ([`Devices::store`]).
#[no_mangle]
pub extern "C" fn sg_store_new(devs: *const SgDevices, out: *mut *mut SgStore) -> sg_status {
    run("sg_store_new", || {
        let d = ptr::obj(devs, "devs")?;
        ptr::slot(out, "store")?.write(ptr::into_handle(SgStore { store: d.devices.store() }));
        Ok(())
    })
}

/// `sg_store_place_leafs`: places every leaf of `graph` in its planned
/// state, zero-filled ([`SplitStore::place_leafs`]).
#[no_mangle]
pub extern "C" fn sg_store_place_leafs(
    store: *mut SgStore,
    ctx: *const SgContext,
    graph: *const SgGraph,
    plan: *const SgPlan,
) -> sg_status {
    run("sg_store_place_leafs", || {
        let s = ptr::obj_mut(store, "store")?;
        let c = ptr::obj(ctx, "ctx")?;
        let g = ptr::obj(graph, "graph")?;
        let p = ptr::obj(plan, "plan")?;
        g.check(c)?;
        Ok(s.store.place_leafs(&c.ctx, &g.graph, &p.plan)?)
    })
}

/// The store and tensor id of a store call.
fn store_tensor<'a>(
    store: *mut SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
) -> R<(&'a mut SgStore, &'a SgContext, TensorId)> {
    let s = ptr::obj_mut(store, "store")?;
    let c = ptr::obj(ctx, "ctx")?;
    let id = c.id(t, "t")?;
    Ok((s, c, id))
}

/// The store (shared) and tensor id of a store read.
fn store_tensor_ref<'a>(
    store: *const SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
) -> R<(&'a SgStore, &'a SgContext, TensorId)> {
    let s = ptr::obj(store, "store")?;
    let c = ptr::obj(ctx, "ctx")?;
    let id = c.id(t, "t")?;
    Ok((s, c, id))
}

/// Checks a caller's element count against tensor `id`'s.
fn check_elements(c: &SgContext, id: TensorId, n: usize) -> R {
    let t = c.ctx.tensor(id)?;
    if t.nelements() != n as i64 {
        return arg(format!("{n} values for tensor {:?} {} of {} elements", t.name, t.describe(), t.nelements()));
    }
    Ok(())
}

/// `sg_store_set_f32`: writes all `n` elements of `t` from F32 values,
/// converted to its type ([`SplitStore::set_f32`]: F16/BF16 rounded,
/// block types quantized as ggml's reference quantizer does).
#[no_mangle]
pub extern "C" fn sg_store_set_f32(
    store: *mut SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
    values: *const f32,
    n: usize,
) -> sg_status {
    run("sg_store_set_f32", || {
        let (s, c, id) = store_tensor(store, ctx, t)?;
        let values = ptr::slice(values, n, "values")?;
        check_elements(c, id, n)?;
        Ok(s.store.set_f32(&c.ctx, id, values)?)
    })
}

/// `sg_store_get_f32`: reads all `n` elements of `t` as F32
/// ([`SplitStore::get_f32`]: assembled from the devices, dequantized).
#[no_mangle]
pub extern "C" fn sg_store_get_f32(
    store: *const SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
    out: *mut f32,
    n: usize,
) -> sg_status {
    run("sg_store_get_f32", || {
        let (s, c, id) = store_tensor_ref(store, ctx, t)?;
        let out = ptr::slice_mut(out, n, "out")?;
        check_elements(c, id, n)?;
        out.copy_from_slice(&s.store.get_f32(&c.ctx, id)?);
        Ok(())
    })
}

/// `sg_store_set_i32`: writes all `n` elements of I32 tensor `t`
/// ([`SplitStore::set_i32`]).
#[no_mangle]
pub extern "C" fn sg_store_set_i32(
    store: *mut SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
    values: *const i32,
    n: usize,
) -> sg_status {
    run("sg_store_set_i32", || {
        let (s, c, id) = store_tensor(store, ctx, t)?;
        let values = ptr::slice(values, n, "values")?;
        check_elements(c, id, n)?;
        Ok(s.store.set_i32(&c.ctx, id, values)?)
    })
}

/// `sg_store_get_i32`: reads all `n` elements of I32 tensor `t`
/// ([`SplitStore::get_i32`]).
#[no_mangle]
pub extern "C" fn sg_store_get_i32(
    store: *const SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
    out: *mut i32,
    n: usize,
) -> sg_status {
    run("sg_store_get_i32", || {
        let (s, c, id) = store_tensor_ref(store, ctx, t)?;
        let out = ptr::slice_mut(out, n, "out")?;
        check_elements(c, id, n)?;
        out.copy_from_slice(&s.store.get_i32(&c.ctx, id)?);
        Ok(())
    })
}

/// `sg_store_set_bytes`: writes `size` bytes at byte `offset` of `t`'s
/// single-device memory ([`SplitStore::set_tensor`]).
#[no_mangle]
pub extern "C" fn sg_store_set_bytes(
    store: *mut SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
    offset: usize,
    data: *const std::ffi::c_void,
    size: usize,
) -> sg_status {
    run("sg_store_set_bytes", || {
        let (s, c, id) = store_tensor(store, ctx, t)?;
        let data = ptr::slice(data.cast::<u8>(), size, "data")?;
        Ok(s.store.set_tensor(&c.ctx, id, offset, data)?)
    })
}

/// `sg_store_get_bytes`: reads `size` bytes at byte `offset` of `t`'s
/// single-device memory ([`SplitStore::get_tensor`]).
#[no_mangle]
pub extern "C" fn sg_store_get_bytes(
    store: *const SgStore,
    ctx: *const SgContext,
    t: sg_tensor,
    offset: usize,
    out: *mut std::ffi::c_void,
    size: usize,
) -> sg_status {
    run("sg_store_get_bytes", || {
        let (s, c, id) = store_tensor_ref(store, ctx, t)?;
        let out = ptr::slice_mut(out.cast::<u8>(), size, "out")?;
        Ok(s.store.get_tensor(&c.ctx, id, offset, out)?)
    })
}

/// `sg_store_free`: frees a store and the device memory it holds (NULL:
/// nothing).
#[no_mangle]
pub extern "C" fn sg_store_free(store: *mut SgStore) -> sg_status {
    run("sg_store_free", || {
        ptr::free(store);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Executor and reports
// ---------------------------------------------------------------------------

/// `sg_executor_new`: an executor over the devices ([`Devices::executor`]).
#[no_mangle]
pub extern "C" fn sg_executor_new(devs: *const SgDevices, out: *mut *mut SgExecutor) -> sg_status {
    run("sg_executor_new", || {
        let d = ptr::obj(devs, "devs")?;
        let out = ptr::slot(out, "exec")?;
        let exec = d.devices.executor()?;
        out.write(ptr::into_handle(SgExecutor { exec }));
        Ok(())
    })
}

/// `sg_executor_free`: frees an executor (NULL: nothing).
#[no_mangle]
pub extern "C" fn sg_executor_free(exec: *mut SgExecutor) -> sg_status {
    run("sg_executor_free", || {
        ptr::free(exec);
        Ok(())
    })
}

/// `sg_execute`: runs `plan` for `graph` with leafs from `store` and
/// returns the full values of `outputs[0..n_outputs]` in a report
/// ([`MetaExecutor::execute`]).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_execute(
    exec: *const SgExecutor,
    ctx: *const SgContext,
    graph: *const SgGraph,
    plan: *const SgPlan,
    store: *mut SgStore,
    outputs: *const sg_tensor,
    n_outputs: usize,
    out: *mut *mut SgReport,
) -> sg_status {
    run("sg_execute", || {
        let e = ptr::obj(exec, "exec")?;
        let c = ptr::obj(ctx, "ctx")?;
        let g = ptr::obj(graph, "graph")?;
        let p = ptr::obj(plan, "plan")?;
        let s = ptr::obj_mut(store, "store")?;
        let out = ptr::slot(out, "report")?;
        g.check(c)?;
        let ids =
            ptr::slice(outputs, n_outputs, "outputs")?.iter().map(|&h| c.id(h, "outputs[]")).collect::<R<Vec<_>>>()?;
        let layouts =
            ids.iter().map(|&id| c.ctx.tensor(id).map(|t| (t.ty, t.ne))).collect::<shardgraph::Result<Vec<_>>>()?;
        let report = e.exec.execute(&c.ctx, &g.graph, &p.plan, &mut s.store, &ids)?;
        out.write(ptr::into_handle(SgReport { report, layouts }));
        Ok(())
    })
}

impl SgReport {
    /// Output `k`'s bytes and layout.
    fn output(&self, k: usize) -> R<(&[u8], GgmlType, [i64; 4])> {
        match (self.report.outputs.get(k), self.layouts.get(k)) {
            (Some(o), Some(&(ty, ne))) => Ok((&o.bytes, ty, ne)),
            _ => arg(format!("output {k} of a report with {} outputs", self.layouts.len())),
        }
    }

    /// Output `k`'s values as 4-byte elements of type `want` into `out`.
    fn read4<T: Copy>(&self, k: usize, want: GgmlType, out: &mut [T], conv: impl Fn([u8; 4]) -> T) -> R {
        let (bytes, ty, ne) = self.output(k)?;
        if ty != want {
            return arg(format!("output {k} is {ty}{ne:?}, not {want}"));
        }
        if bytes.len() != out.len() * 4 {
            return arg(format!("{} values for output {k} {ty}{ne:?} of {} elements", out.len(), bytes.len() / 4));
        }
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = conv([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }
}

/// `sg_report_n_outputs`: the number of outputs.
#[no_mangle]
pub extern "C" fn sg_report_n_outputs(report: *const SgReport, out: *mut usize) -> sg_status {
    run("sg_report_n_outputs", || {
        let r = ptr::obj(report, "report")?;
        ptr::slot(out, "n")?.write(r.layouts.len());
        Ok(())
    })
}

/// `sg_report_output_f32`: output `k` (an F32 tensor of `n` elements).
#[no_mangle]
pub extern "C" fn sg_report_output_f32(report: *const SgReport, k: usize, out: *mut f32, n: usize) -> sg_status {
    run("sg_report_output_f32", || {
        let r = ptr::obj(report, "report")?;
        let out = ptr::slice_mut(out, n, "out")?;
        r.read4(k, GgmlType::F32, out, f32::from_le_bytes)
    })
}

/// `sg_report_output_i32`: output `k` (an I32 tensor of `n` elements).
#[no_mangle]
pub extern "C" fn sg_report_output_i32(report: *const SgReport, k: usize, out: *mut i32, n: usize) -> sg_status {
    run("sg_report_output_i32", || {
        let r = ptr::obj(report, "report")?;
        let out = ptr::slice_mut(out, n, "out")?;
        r.read4(k, GgmlType::I32, out, i32::from_le_bytes)
    })
}

/// `sg_report_output_bytes`: output `k`'s contiguous bytes (any type);
/// `size` must be its byte size (`*needed` gets it; `out` may be NULL with
/// `size` 0 to ask).
#[no_mangle]
pub extern "C" fn sg_report_output_bytes(
    report: *const SgReport,
    k: usize,
    out: *mut std::ffi::c_void,
    size: usize,
    needed: *mut usize,
) -> sg_status {
    run("sg_report_output_bytes", || {
        let r = ptr::obj(report, "report")?;
        let (bytes, ty, ne) = r.output(k)?;
        write_opt(needed, bytes.len(), "needed")?;
        if size == 0 && out.is_null() {
            return Ok(());
        }
        let out = ptr::slice_mut(out.cast::<u8>(), size, "out")?;
        if out.len() != bytes.len() {
            return arg(format!("{size} bytes for output {k} {ty}{ne:?} of {} bytes", bytes.len()));
        }
        out.copy_from_slice(bytes);
        Ok(())
    })
}

/// `sg_report_bytes_moved`: bytes the devices received during the run.
#[no_mangle]
pub extern "C" fn sg_report_bytes_moved(report: *const SgReport, out: *mut u64) -> sg_status {
    run("sg_report_bytes_moved", || {
        let r = ptr::obj(report, "report")?;
        ptr::slot(out, "bytes")?.write(r.report.bytes_moved);
        Ok(())
    })
}

/// `sg_report_free`: frees a report (NULL: nothing).
#[no_mangle]
pub extern "C" fn sg_report_free(report: *mut SgReport) -> sg_status {
    run("sg_report_free", || {
        ptr::free(report);
        Ok(())
    })
}
