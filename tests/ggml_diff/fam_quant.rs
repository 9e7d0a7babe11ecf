//! Differential cases of this op family.

use crate::harness::Case;

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    vec![]
}
