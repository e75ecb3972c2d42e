//! Faulted devices on the wire: [`DeviceFault`] as `ListFaults` sends it ([`FaultInfo`], `(sssss)`).

use mdev_types::fault::{DeviceFault, FaultScope};
use vgpu_client::FaultInfo;

/// The scope's one machine name, the same as in `vgpuctl discover --json` (`pci-device`, …).
fn scope_name(scope: FaultScope) -> String {
    match serde_json::to_value(scope) {
        Ok(serde_json::Value::String(s)) => s,
        _ => scope.as_str().to_string(),
    }
}

/// One fault as `ListFaults` returns it.
pub(super) fn info(f: &DeviceFault) -> FaultInfo {
    FaultInfo {
        scope: scope_name(f.scope),
        device: f.device.clone(),
        path: f.path.display().to_string(),
        problem: f.cause.to_string(),
        fix: f.fix.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdev_types::fault::FaultCause;

    #[test]
    fn a_fault_travels_with_its_scope_path_problem_and_fix() {
        let f = DeviceFault {
            scope: FaultScope::PciDevice,
            device: "0000:00:03.0".into(),
            path: "/sys/bus/pci/devices/0000:00:03.0/vendor".into(),
            cause: FaultCause::Errno {
                op: "reading".into(),
                errno: "EIO".into(),
                code: 5,
            },
            fix: None,
        };
        let i = info(&f);
        assert_eq!(i.scope, "pci-device");
        assert_eq!(i.problem, "reading failed: EIO");
        assert_eq!(i.fix(), None);
    }
}
