//! The i915 `prelim_iov` layout and module parameters (the `vendors` host).

use nix::errno::Errno;

use super::{rd, wr, wr_err};
use crate::SimHost;
use vgpu_host::{Host, HostExt};

const IOV: &str = "/sys/class/drm/card0/prelim_iov";

fn vendors() -> SimHost {
    SimHost::builtin("vendors").unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn prelim_iov_has_pf_and_every_possible_vf() {
    let h = vendors();
    // The card link resolves below the PF's device directory.
    let card = h
        .canonicalize(std::path::Path::new("/sys/class/drm/card0"))
        .unwrap();
    assert!(
        card.ends_with("0000:00:02.0/drm/card0"),
        "{}",
        card.display()
    );
    assert_eq!(rd(&h, &format!("{IOV}/pf/gt/exec_quantum_ms")), "0");
    // Flex 140: vf1 … vf12, each with its quotas; the PF has no quota files.
    assert_eq!(rd(&h, &format!("{IOV}/vf12/gt/lmem_quota")), "0");
    assert!(!h.exists(std::path::Path::new(&format!("{IOV}/vf13"))));
    assert!(!h.exists(std::path::Path::new(&format!("{IOV}/pf/gt/lmem_quota"))));
}

#[test]
fn prelim_iov_knobs_parse_and_clamp_like_the_kernel() {
    let h = vendors();
    let q = format!("{IOV}/vf2/gt/exec_quantum_ms");
    wr(&h, &q, "0x10");
    assert_eq!(rd(&h, &q), "16");
    wr(&h, &q, "250000");
    assert_eq!(rd(&h, &q), "100000");
    assert_eq!(wr_err(&h, &q, "-1"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &q, "abc"), Errno::EINVAL);
    let pt = format!("{IOV}/vf2/gt/preempt_timeout_us");
    wr(&h, &pt, "16000");
    assert_eq!(rd(&h, &pt), "16000");
    let lmem = format!("{IOV}/vf1/gt/lmem_quota");
    wr(&h, &lmem, "4294967296");
    assert_eq!(rd(&h, &lmem), "4294967296");
}

#[test]
fn prelim_iov_goes_away_with_the_pf_driver() {
    let h = vendors();
    wr(&h, "/sys/bus/pci/drivers/i915/unbind", "0000:00:02.0");
    assert!(!h.exists(std::path::Path::new("/sys/class/drm/card0")));
}

#[test]
fn module_parameters_in_sysfs_and_in_the_driver_listing() {
    let h = vendors();
    assert_eq!(rd(&h, "/sys/module/gim/parameters/sch_policy"), "4");
    assert_eq!(rd(&h, "/sys/module/gim/parameters/vf_num"), "2");
    // Parameters are read-only.
    assert_eq!(
        h.write(
            std::path::Path::new("/sys/module/gim/parameters/vf_num"),
            "3"
        )
        .unwrap_err()
        .errno,
        Errno::EACCES
    );
    // nvidia's charp parameters have no sysfs file but are listed without the NVreg_ prefix.
    assert!(
        h.read_optional(std::path::Path::new(
            "/sys/module/nvidia/parameters/NVreg_RegistryDwordsPerDevice"
        ))
        .unwrap()
        .is_none()
    );
    let params = rd(&h, "/proc/driver/nvidia/params");
    assert!(params.contains("ModifyDeviceFiles: 1"), "{params}");
    assert!(
        params.contains("RegistryDwordsPerDevice: \"pci=0000:86:00.0;RmPVMRL=0x00030001\""),
        "{params}"
    );
}

#[test]
fn module_tables_are_checked() {
    let bad = [
        ("[[module]]\nname = \"a/b\"\n", "module[0].name"),
        (
            "[[module]]\nname = \"m\"\n[[module]]\nname = \"m\"\n",
            "module[1].name",
        ),
        (
            "[[module]]\nname = \"m\"\nparams_file = \"proc/x\"\n",
            "module[0].params_file",
        ),
        (
            "[[i915_iov]]\npf = \"0000:00:02.0\"\ncard = 0\n",
            "i915_iov[0].pf",
        ),
    ];
    for (text, field) in bad {
        let e = SimHost::from_toml("t.toml", text).unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
}
