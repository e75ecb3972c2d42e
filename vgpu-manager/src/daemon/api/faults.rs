//! The devices discovery could not read, as a request: what `vgpuctl status` shows beside the GPUs.

use mdev_types::fault::DeviceFault;

use super::{Access, Command};

/// Lists every device the host's discovery could not read now (a fresh read of the host), in
/// discovery's order: none on a healthy host. A host that cannot be read at all is the request's
/// [`CoreError::Host`](super::CoreError::Host), not a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFaults;

impl Command for ListFaults {
    type Reply = Vec<DeviceFault>;
    const ACCESS: Access = Access::Read;
}
