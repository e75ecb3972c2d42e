//! Intel xe `sriov_admin` on the demo's Flex 170.

use nix::errno::Errno;

use super::*;

const PF: &str = "/sys/bus/pci/devices/0000:03:00.0";
const ADMIN: &str = "/sys/bus/pci/devices/0000:03:00.0/sriov_admin";

#[test]
fn admin_tree_follows_the_abi() {
    let h = SimHost::builtin("demo").unwrap();
    assert_eq!(rd(&h, &format!("{PF}/sriov_totalvfs")), "31");
    let entries = h.list(&p(ADMIN)).unwrap();
    // pf, vf1 … vf31 (one per possible VF) and the hidden .bulk_profile.
    assert_eq!(entries.len(), 33);
    assert!(entries.contains(&".bulk_profile".to_string()));
    assert!(entries.contains(&"vf31".to_string()));
    assert!(!entries.contains(&"vf32".to_string()));
    assert_eq!(
        h.canonicalize(&p(&format!("{ADMIN}/pf/device"))).unwrap(),
        h.canonicalize(&p(PF)).unwrap()
    );
    assert_eq!(
        h.read_link(&p(&format!("{ADMIN}/pf/device"))).unwrap(),
        p("../../../0000:03:00.0")
    );
    // VF device links only for enabled VFs.
    assert!(!h.exists(&p(&format!("{ADMIN}/vf1/device"))));
    assert_eq!(
        rd(&h, &format!("{ADMIN}/pf/profile/sched_priority")),
        "[low] normal high"
    );
    assert_eq!(
        rd(&h, &format!("{ADMIN}/vf1/profile/sched_priority")),
        "[low] normal"
    );
    assert_eq!(rd(&h, &format!("{ADMIN}/vf1/profile/exec_quantum_ms")), "0");
    assert_eq!(
        rd(&h, &format!("{ADMIN}/vf1/profile/preempt_timeout_us")),
        "0"
    );
    assert_eq!(rd(&h, &format!("{ADMIN}/vf1/profile/vram_quota")), "0");
    assert_eq!(
        errno(h.read(&p(&format!("{ADMIN}/.bulk_profile/exec_quantum_ms")))),
        Errno::EACCES
    );
}

#[test]
fn enabling_vfs_links_and_auto_provisions_vram() {
    let h = SimHost::builtin("demo").unwrap();
    wr(&h, &format!("{PF}/sriov_drivers_autoprobe"), "0");
    wr(&h, &format!("{PF}/sriov_numvfs"), "4");
    for n in 1..=4 {
        let vf = h
            .canonicalize(&p(&format!("{ADMIN}/vf{n}/device")))
            .unwrap();
        assert_eq!(
            vf,
            h.canonicalize(&p(&format!("{PF}/virtfn{}", n - 1)))
                .unwrap()
        );
        // 16 GiB split over 4 VFs, in 2 MiB units.
        assert_eq!(
            rd(&h, &format!("{ADMIN}/vf{n}/profile/vram_quota")),
            "4294967296"
        );
    }
    assert!(!h.exists(&p(&format!("{ADMIN}/vf5/device"))));
    // VFs stay unbound with autoprobe off.
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:03:00.1/driver"),
        None
    );
    assert_eq!(rd(&h, "/sys/bus/pci/devices/0000:03:00.4/device"), "0x56c0");
    wr(&h, &format!("{PF}/sriov_numvfs"), "0");
    assert!(!h.exists(&p(&format!("{ADMIN}/vf1/device"))));
    assert_eq!(rd(&h, &format!("{ADMIN}/vf1/profile/vram_quota")), "0");
}

#[test]
fn scheduling_knobs() {
    let h = SimHost::builtin("demo").unwrap();
    let eq = format!("{ADMIN}/vf2/profile/exec_quantum_ms");
    wr(&h, &eq, "20\n");
    assert_eq!(rd(&h, &eq), "20");
    // GuC clamps silently at GUC_KLV_VF_CFG_EXEC_QUANTUM_MAX_VALUE.
    wr(&h, &eq, "250000");
    assert_eq!(rd(&h, &eq), "100000");
    assert_eq!(wr_err(&h, &eq, "fast"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &eq, "-1"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &eq, "4294967296"), Errno::ERANGE);
    let pt = format!("{ADMIN}/pf/profile/preempt_timeout_us");
    wr(&h, &pt, "20000");
    assert_eq!(rd(&h, &pt), "20000");
    wr(&h, &pt, "4000000000");
    assert_eq!(rd(&h, &pt), "100000000");
    // Bulk: every function.
    wr(&h, &format!("{ADMIN}/.bulk_profile/exec_quantum_ms"), "8");
    assert_eq!(rd(&h, &format!("{ADMIN}/pf/profile/exec_quantum_ms")), "8");
    assert_eq!(
        rd(&h, &format!("{ADMIN}/vf31/profile/exec_quantum_ms")),
        "8"
    );
    // Priorities: only the PF's own file may say high; VF files are read-only.
    let prio = format!("{ADMIN}/pf/profile/sched_priority");
    wr(&h, &prio, "high\n");
    assert_eq!(rd(&h, &prio), "low normal [high]");
    assert_eq!(wr_err(&h, &prio, "urgent"), Errno::EINVAL);
    assert_eq!(
        wr_err(&h, &format!("{ADMIN}/vf1/profile/sched_priority"), "normal"),
        Errno::EACCES
    );
    assert_eq!(
        wr_err(&h, &format!("{ADMIN}/.bulk_profile/sched_priority"), "high"),
        Errno::EINVAL
    );
    wr(
        &h,
        &format!("{ADMIN}/.bulk_profile/sched_priority"),
        "normal",
    );
    assert_eq!(
        rd(&h, &format!("{ADMIN}/vf7/profile/sched_priority")),
        "low [normal]"
    );
    assert_eq!(rd(&h, &prio), "low [normal] high");
}

#[test]
fn vram_quota_and_stop() {
    let h = SimHost::builtin("demo").unwrap();
    let q = format!("{ADMIN}/vf1/profile/vram_quota");
    wr(&h, &q, "1000000");
    // Aligned up to 2 MiB.
    assert_eq!(rd(&h, &q), "2097152");
    assert_eq!(wr_err(&h, &q, "17179869185"), Errno::ENOSPC);
    assert_eq!(wr_err(&h, &q, "lots"), Errno::EINVAL);
    // Explicit provisioning blocks auto-provisioning of the others.
    wr(&h, &format!("{PF}/sriov_numvfs"), "2");
    assert_eq!(rd(&h, &q), "2097152");
    assert_eq!(rd(&h, &format!("{ADMIN}/vf2/profile/vram_quota")), "0");
    // Bulk: every VF (31 × 512 MiB fits in 16 GiB; 31 × 1 GiB does not).
    assert_eq!(
        wr_err(
            &h,
            &format!("{ADMIN}/.bulk_profile/vram_quota"),
            "1073741824"
        ),
        Errno::ENOSPC
    );
    wr(
        &h,
        &format!("{ADMIN}/.bulk_profile/vram_quota"),
        "536870912",
    );
    assert_eq!(
        rd(&h, &format!("{ADMIN}/vf2/profile/vram_quota")),
        "536870912"
    );
    assert_eq!(rd(&h, &q), "536870912");
    let stop = format!("{ADMIN}/vf1/stop");
    assert_eq!(wr_err(&h, &stop, "please"), Errno::EINVAL);
    wr(&h, &stop, "1");
    assert_eq!(errno(h.read(&p(&stop))), Errno::EACCES);
}

#[test]
fn admin_tree_exists_only_while_xe_is_bound() {
    let h = SimHost::builtin("demo").unwrap();
    wr(&h, &format!("{ADMIN}/vf3/profile/exec_quantum_ms"), "16");
    wr(&h, "/sys/bus/pci/drivers/xe/unbind", "0000:03:00.0");
    assert!(!h.exists(&p(ADMIN)));
    wr(&h, "/sys/bus/pci/drivers/xe/bind", "0000:03:00.0");
    assert_eq!(rd(&h, &format!("{ADMIN}/vf3/profile/exec_quantum_ms")), "0");
}
