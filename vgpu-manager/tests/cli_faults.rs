//! `vgpuctl discover` on a host where one GPU cannot be read: exit 0, the faulted GPU shown plainly
//! (table and `--json` `faults` list), every other GPU listed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use vgpu_sim::SimHost;

fn vgpuctl(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .arg("--sysfs-root")
        .arg(root)
        .args(args)
        .env_remove("VGPU_SYSFS_ROOT")
        .output()
        .expect("run vgpuctl")
}

/// The demo host below a temp dir with the first T4's vendor and device ids emptied (the `PCI_ID`
/// of its `uevent`); returns its address.
fn faulty_demo(tmp: &Path) -> String {
    SimHost::builtin("demo").unwrap().materialize(tmp).unwrap();
    let mut parents: Vec<String> = std::fs::read_dir(tmp.join("sys/class/mdev_bus"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("0000:"))
        .collect();
    parents.sort();
    let victim = parents.remove(0);
    let uevent =
        std::fs::canonicalize(tmp.join(format!("sys/bus/pci/devices/{victim}/uevent"))).unwrap();
    let text = std::fs::read_to_string(&uevent).unwrap();
    let emptied: String = text
        .lines()
        .map(|l| {
            if l.starts_with("PCI_ID=") {
                "PCI_ID="
            } else {
                l
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(emptied, text);
    std::fs::write(uevent, emptied).unwrap();
    victim
}

#[test]
fn discover_shows_a_faulted_gpu_and_lists_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let victim = faulty_demo(tmp.path());
    let o = vgpuctl(tmp.path(), &["discover"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "stdout: {out}\nstderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("FAULTED"), "{out}");
    assert!(out.contains(&format!("{victim}/uevent")), "{out}");
    for needle in ["NVIDIA T4", "NVIDIA L40S", "Flex 170", "MI300X"] {
        assert!(out.contains(needle), "{needle} missing from:\n{out}");
    }

    let o = vgpuctl(tmp.path(), &["discover", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let faults = v["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!(faults[0]["device"], victim.as_str());
    assert_eq!(faults[0]["scope"], "pci-device");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 5);
}
