//! Constructors and shape rules of this op family (see `crate::ops`).

use crate::graph::Context;

impl Context {}
