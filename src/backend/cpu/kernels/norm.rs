//! CPU kernels of this op family.

use super::{unsupported, TView};
use crate::error::Result;
use crate::ops::Op;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    Err(unsupported(op, dst, src))
}
