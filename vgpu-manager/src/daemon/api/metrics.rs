//! The metrics request.

use super::{Access, Command};
use crate::daemon::metrics::Format;

/// Every metric family vgpud exports (GPUs, types, instances, pools, operations, the process), in
/// `format`, as a scrape of `vgpud --metrics-listen` would get it (`docs/metrics.md`). Read-only:
/// answered from the engine's views, reading the host only when they changed since the last
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetMetrics {
    /// The exposition format.
    pub format: Format,
}

impl Command for GetMetrics {
    type Reply = String;
    const ACCESS: Access = Access::Read;
}
