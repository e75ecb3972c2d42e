//! Why a claim could not be prepared or unprepared ([`DriverError`]).

use vgpu_client::ClientError;

use crate::checkpoint::CheckpointError;
use crate::claim::ClaimError;
use crate::device_name::DeviceNameError;
use crate::fsutil::FsError;
use crate::vf_slot::VfSlotError;

/// Why a claim could not be prepared or unprepared. Sent to the kubelet as the claim's error.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The claim could not be read.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The API server has another claim under that name.
    #[error(
        "claim {namespace}/{name} has UID {found} in the API server, not {expected}: it was deleted and made again; the kubelet will retry with the new one"
    )]
    UidMismatch {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The UID the kubelet gave.
        expected: String,
        /// The UID the API server has.
        found: String,
    },
    /// The claim has no allocation yet.
    #[error(
        "claim {namespace}/{name} is not allocated yet; the kubelet prepares only allocated claims, so retry"
    )]
    NotAllocated {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
    },
    /// An allocated device name is not one of this driver's.
    #[error(
        "claim {namespace}/{name} was allocated device {device:?}, which this driver does not publish"
    )]
    Device {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The device.
        device: String,
        /// Why it does not parse.
        #[source]
        source: DeviceNameError,
    },
    /// The device belongs to another node's pool.
    #[error(
        "claim {namespace}/{name} was allocated device {device} from pool {pool:?}, but this node's pool is {ours:?}"
    )]
    WrongPool {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node's pool.
        ours: String,
    },
    /// A vgpud call failed.
    #[error("vgpud could not {action} vGPU {uuid} ({profile} on {gpu}) for claim {claim}")]
    Vgpud {
        /// `create` or `destroy`, `find`.
        action: &'static str,
        /// The vGPU's UUID.
        uuid: String,
        /// The profile.
        profile: String,
        /// The GPU.
        gpu: String,
        /// The claim `namespace/name`.
        claim: String,
        /// The daemon's or the bus's error.
        #[source]
        source: Box<ClientError>,
    },
    /// The vGPU with our UUID is not what we would have made.
    #[error(
        "vGPU {uuid} exists on {found_gpu} with profile {found_profile:?}, not {profile} on {gpu}: it was not made for this claim; destroy it (vgpuctl destroy {uuid}) if it is unused"
    )]
    Conflict {
        /// The UUID.
        uuid: String,
        /// The GPU wanted.
        gpu: String,
        /// The profile wanted.
        profile: String,
        /// The GPU it is on.
        found_gpu: String,
        /// Its profile.
        found_profile: String,
    },
    /// The vGPU runs without an IOMMU group, so it has no VFIO device node.
    #[error(
        "vGPU {uuid} is {state} without an IOMMU group, so containers cannot reach it; check vgpuctl show {uuid}"
    )]
    NoIommuGroup {
        /// The UUID.
        uuid: String,
        /// Its state.
        state: String,
    },
    /// vgpud's offers, which say whether a device is VF-backed, could not be read.
    #[error("vgpud could not list its offers to prepare claim {claim}")]
    Offers {
        /// The claim `namespace/name`.
        claim: String,
        /// The daemon's or the bus's error.
        #[source]
        source: Box<ClientError>,
    },
    /// A VF-backed device's pool could not be applied or removed.
    #[error(transparent)]
    VfSlot(#[from] VfSlotError),
    /// The checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A CDI spec or metadata file could not be written or removed.
    #[error(transparent)]
    Fs(#[from] FsError),
}
