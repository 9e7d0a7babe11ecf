//! Loading GGUF tensors into placed storage: tensor-parallel device storage
//! ([`SplitStore`]) or one CPU device ([`TensorStorage`]).
//!
//! Into a [`SplitStore`], a tensor of a mapped file is not copied at all:
//! each device part that is one contiguous run of the tensor (mirrored, or
//! a split of its rows) refers to its range of the file
//! ([`SplitStore::set_tensor_mapped`]), and a CPU device computes on those
//! pages where they are mapped (shared page cache, as llama.cpp's mmap), so
//! the weights cost their file size once and loading reads nothing until
//! a step needs it; GPUs copy each part once when the first run moves it
//! there. Other parts (a split along a row, a file parsed from memory) are
//! copied from the file straight into their part. The file must therefore
//! stay as it is while the model lives (see [`GgufFile::open`]). Into a
//! [`TensorStorage`] the bytes are copied into its allocated buffers
//! (`set_bytes`).

use super::gguf_err;
use super::reader::{GgufFile, GgufTensor};
use crate::backend::TensorStorage;
use crate::error::Result;
use crate::graph::Context;
use crate::split::SplitStore;
use crate::tensor::TensorId;
use std::collections::HashMap;

/// What a bulk load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Tensors loaded, with their context ids, in file order.
    pub loaded: Vec<(String, TensorId)>,
    /// Bytes loaded from the file (mapped or copied; single-device bytes:
    /// a mirrored tensor lands on every device but counts once).
    pub bytes: u64,
    /// Tensors of the file that no tensor of the context is named after
    /// (left alone), in file order.
    pub unused: Vec<String>,
}

/// Checks that context tensor `id` can take file tensor `t`: not a view,
/// same type, same `ne` (ggml order, missing dims 1), contiguous.
fn check_match(file: &GgufFile, t: &GgufTensor<'_>, ctx: &Context, id: TensorId) -> Result<()> {
    let ct = ctx.tensor(id)?;
    let bad = |d: String| gguf_err(file.name(), format!("tensor {:?}: {d}", t.info.name));
    if ct.view_src.is_some() {
        return Err(bad(format!("the context tensor {:?} is a view; load into its owner", ct.name)));
    }
    if ct.ty != t.info.ty || ct.ne != t.info.ne {
        return Err(bad(format!(
            "file has {}, the context tensor {:?} is {}",
            t.info.describe(),
            ct.name,
            ct.describe()
        )));
    }
    if !ct.is_contiguous() || ct.nbytes() != t.data.len() {
        return Err(bad(format!(
            "the context tensor {:?} ({}) is not a contiguous {} bytes",
            ct.name,
            ct.describe(),
            t.data.len()
        )));
    }
    Ok(())
}

/// Makes file tensor `t` (checked by [`check_match`]) the whole of `id` in
/// `store`: its range of the mapped file where the file is mapped
/// ([`SplitStore::set_tensor_mapped`]), else a copy of its bytes.
fn set_from_file(
    file: &GgufFile,
    t: &GgufTensor<'_>,
    ctx: &Context,
    id: TensorId,
    store: &mut SplitStore,
) -> Result<()> {
    match file.mapped(t) {
        Some(m) => store.set_tensor_mapped(ctx, id, &m),
        None => store.set_tensor(ctx, id, 0, t.data),
    }
}

/// Loads file tensor `name` into context tensor `id`, which must be placed
/// in `store` (in any split state): [`SplitStore::set_tensor_mapped`] with
/// its range of a mapped file (no copy where a part is one run of it), else
/// `store.set_tensor(ctx, id, 0, bytes)`.
///
/// # Errors
/// [`crate::Error::Gguf`] naming the tensor if the file lacks it or the
/// context tensor differs in type or shape (or is a view); errors of
/// [`SplitStore::set_tensor`] (e.g. [`crate::Error::Split`] if `id` is not placed).
pub fn load_tensor_into_split_store(
    file: &GgufFile,
    name: &str,
    ctx: &Context,
    id: TensorId,
    store: &mut SplitStore,
) -> Result<usize> {
    let t = file.tensor(name)?;
    check_match(file, &t, ctx, id)?;
    set_from_file(file, &t, ctx, id, store)?;
    Ok(t.data.len())
}

/// Copies file tensor `name` into context tensor `id`, which must have
/// storage in `storage` (one device): `storage.set_bytes(ctx, id, 0, bytes)`.
///
/// # Errors
/// As [`load_tensor_into_split_store`]; errors of [`TensorStorage::set_bytes`]
/// ([`crate::Error::NoStorage`] if `id` has no storage).
pub fn load_tensor_into_storage(
    file: &GgufFile,
    name: &str,
    ctx: &Context,
    id: TensorId,
    storage: &TensorStorage,
) -> Result<usize> {
    let t = file.tensor(name)?;
    check_match(file, &t, ctx, id)?;
    storage.set_bytes(ctx, id, 0, t.data)?;
    Ok(t.data.len())
}

/// File tensor indices paired with context tensors, and the names of file
/// tensors left unpaired.
type Matches = (Vec<(usize, TensorId)>, Vec<String>);

/// Pairs every file tensor with the context's non-view tensor of the same
/// name; file tensors without one are listed as unused.
fn match_names(file: &GgufFile, ctx: &Context) -> Result<Matches> {
    let mut by_name: HashMap<&str, Vec<TensorId>> = HashMap::new();
    for id in ctx.ids() {
        let t = ctx.tensor(id)?;
        if t.view_src.is_none() && !t.name.is_empty() {
            by_name.entry(t.name.as_str()).or_default().push(id);
        }
    }
    let mut pairs = Vec::new();
    let mut unused = Vec::new();
    for (i, info) in file.tensors().iter().enumerate() {
        match by_name.get(info.name.as_str()).map(Vec::as_slice) {
            None | Some([]) => unused.push(info.name.clone()),
            Some([id]) => pairs.push((i, *id)),
            Some(ids) => {
                return Err(gguf_err(
                    file.name(),
                    format!("tensor {:?}: {} tensors of the context have that name", info.name, ids.len()),
                ))
            }
        }
    }
    Ok((pairs, unused))
}

/// Loads every tensor of `file` into the context tensor of the same name
/// (a non-view tensor placed in `store`, e.g. by
/// [`SplitStore::place_leafs`] for a plan), splitting, mirroring or
/// assigning it to device 0 of a partial state as the placement says.
/// Every match is checked (type, shape) before any byte is copied; file
/// tensors the context does not name are reported in
/// [`LoadReport::unused`].
///
/// # Errors
/// [`crate::Error::Gguf`] naming the tensor for a type/shape mismatch or a
/// name shared by several context tensors; [`crate::Error::Split`] naming it
/// if it is not placed in `store`.
pub fn load_into_split_store(file: &GgufFile, ctx: &Context, store: &mut SplitStore) -> Result<LoadReport> {
    let (pairs, unused) = match_names(file, ctx)?;
    let mut tensors = Vec::with_capacity(pairs.len());
    for &(i, id) in &pairs {
        let t = file.tensor_at(i).ok_or_else(|| gguf_err(file.name(), format!("tensor {i} has no data")))?;
        check_match(file, &t, ctx, id)?;
        if store.get_stored(id).is_none() {
            return Err(crate::Error::Split {
                detail: format!("tensor {:?} from {} is not placed on the devices", t.info.name, file.name()),
            });
        }
        tensors.push((t, id));
    }
    let mut report = LoadReport { unused, ..LoadReport::default() };
    for (t, id) in tensors {
        set_from_file(file, &t, ctx, id, store)?;
        report.bytes += t.data.len() as u64;
        report.loaded.push((t.info.name.clone(), id));
    }
    Ok(report)
}

/// Loads every tensor of `file` into the context tensor of the same name,
/// which must have storage in `storage` (one device, e.g. from
/// [`TensorStorage::alloc_tensors`]). Matches are checked before copying, as
/// in [`load_into_split_store`].
///
/// # Errors
/// [`crate::Error::Gguf`] naming the tensor for a type/shape mismatch or a
/// shared name; [`crate::Error::NoStorage`] for a tensor without storage.
pub fn load_into_storage(file: &GgufFile, ctx: &Context, storage: &TensorStorage) -> Result<LoadReport> {
    let (pairs, unused) = match_names(file, ctx)?;
    let mut tensors = Vec::with_capacity(pairs.len());
    for &(i, id) in &pairs {
        let t = file.tensor_at(i).ok_or_else(|| gguf_err(file.name(), format!("tensor {i} has no data")))?;
        check_match(file, &t, ctx, id)?;
        // A zero-length read fails exactly when the tensor has no storage.
        storage.get_bytes(ctx, id, 0, &mut [])?;
        tensors.push((t, id));
    }
    let mut report = LoadReport { unused, ..LoadReport::default() };
    for (t, id) in tensors {
        storage.set_bytes(ctx, id, 0, t.data)?;
        report.bytes += t.data.len() as u64;
        report.loaded.push((t.info.name.clone(), id));
    }
    Ok(report)
}
