//! The files a prepared claim has on the host: one device-metadata file per request
//! ([`crate::metadata`]) and one CDI spec ([`crate::cdi`]) that gives each vGPU's VFIO device nodes
//! and bind-mounts the metadata files into the container.

use std::collections::BTreeMap;

use crate::cdi;
use crate::checkpoint::{ClaimRecord, PreparedDevice};
use crate::device_name::canonical_pci;
use crate::driver::DriverConfig;
use crate::fsutil::{self, FsError};
use crate::metadata;

/// Writes the metadata files of claim `uid` (one per request) under `cfg.metadata_dir`, then its CDI
/// spec in `cfg.cdi_dir` (none for a claim without devices of ours, which the CDI registry would
/// refuse).
pub fn write(cfg: &DriverConfig, uid: &str, rec: &ClaimRecord) -> Result<(), FsError> {
    let driver = &cfg.driver_name;
    let mut by_request: BTreeMap<&str, Vec<&PreparedDevice>> = BTreeMap::new();
    for d in &rec.devices {
        by_request
            .entry(metadata::base_request(&d.request))
            .or_default()
            .push(d);
    }
    let mut mounts: BTreeMap<&str, cdi::Mount> = BTreeMap::new();
    for (request, devices) in &by_request {
        let md = metadata::DeviceMetadata {
            api_version: metadata::API_VERSION.into(),
            kind: metadata::KIND.into(),
            metadata: metadata::ObjectMeta {
                name: rec.name.clone(),
                namespace: rec.namespace.clone(),
                uid: uid.to_string(),
            },
            pod_claim_name: rec.pod_claim_name.clone(),
            requests: vec![metadata::Request {
                name: (*request).to_string(),
                devices: devices.iter().map(|d| metadata_device(driver, d)).collect(),
            }],
        };
        let host = metadata::host_path(&cfg.metadata_dir, uid, request, driver);
        metadata::write(&host, &md)?;
        let container =
            metadata::container_path(&rec.name, rec.pod_claim_name.as_deref(), request, driver);
        mounts.insert(request, cdi::ro_bind(&host, &container));
    }
    let devices = rec
        .devices
        .iter()
        .map(|d| cdi::Device {
            name: cdi::device_name(uid, &d.device),
            container_edits: cdi::ContainerEdits {
                device_nodes: cdi::vfio_nodes(d.iommu_group.unwrap_or_default()),
                // One mount per request, carried by its first device.
                mounts: mounts
                    .remove(metadata::base_request(&d.request))
                    .into_iter()
                    .collect(),
            },
        })
        .collect();
    let spec = cdi::Spec {
        cdi_version: cdi::CDI_VERSION.into(),
        kind: cdi::kind(),
        devices,
    };
    let path = cdi::spec_path(&cfg.cdi_dir, uid);
    if spec.devices.is_empty() {
        // A claim with none of our devices; the CDI registry refuses a spec without devices.
        fsutil::remove_durably(&path)?;
    } else {
        cdi::write(&path, &spec)?;
    }
    Ok(())
}

/// The metadata entry of `d`: an mdev's UUID and its GPU's PCI address, or a VF-backed device's VF
/// address alone (KubeVirt then gives the VM that PCI device).
fn metadata_device(driver: &str, d: &PreparedDevice) -> metadata::Device {
    let attr = |s: &str| metadata::Attribute {
        string: s.to_string(),
    };
    let attributes: BTreeMap<String, metadata::Attribute> = match (&d.vgpud_pool, &d.vf) {
        (Some(_), vf) => vf
            .iter()
            .map(|vf| (metadata::PCI_BUS_ID.to_string(), attr(vf)))
            .collect(),
        // A virtual parent (the kernel's samples) has no PCI bus id to give.
        (None, _) => std::iter::once((metadata::MDEV_UUID.to_string(), attr(&d.uuid)))
            .chain(canonical_pci(&d.gpu).map(|pci| (metadata::PCI_BUS_ID.to_string(), attr(&pci))))
            .collect(),
    };
    metadata::Device {
        driver: driver.to_string(),
        pool: d.pool.clone(),
        name: d.device.clone(),
        attributes,
    }
}

/// Removes the CDI spec and metadata files of claim `uid`.
pub fn remove(cfg: &DriverConfig, uid: &str) -> Result<(), FsError> {
    fsutil::remove_durably(&cdi::spec_path(&cfg.cdi_dir, uid))?;
    metadata::remove_claim(&cfg.metadata_dir, uid)
}
