//! `list --defined` while vgpud is not on the bus: the definitions are read from mdevctl's directory
//! itself, as mdevctl reads them (mdevctl src/environment.rs `get_defined_devices`), so a libvirt
//! started before vgpud still learns every definition: libvirt's node-device driver asks `mdevctl list
//! --defined --dumpjson` once at its start and again only when `/etc/mdevctl.d` changes or an mdev
//! comes or goes (libvirt src/node_device/node_device_udev.c), and a failed answer would leave it
//! without any definition until then. vgpud keeps a file there for each of its definitions, so the
//! directory holds all of them; changes still need vgpud.

use std::io::Write;
use std::path::Path;

use qemu_glue::mdevctl::{CONFIG_DIR, read_config_dir};
use vgpu_client::ClientError;

use super::{ListArgs, print_list, same_uuid};
use crate::cli::CliError;

/// Whether `e` means that vgpud cannot be asked at all (no bus, nobody owns its name, or the bus failed
/// to start it by D-Bus activation), so that a read-only command may fall back to the files.
pub(super) fn daemon_absent(e: &CliError) -> bool {
    matches!(
        e,
        CliError::Daemon(
            ClientError::NotRunning { .. }
                | ClientError::ActivationFailed { .. }
                | ClientError::Connect { .. }
        )
    )
}

/// `list --defined` from the definition files below `root` (`/` on the live host), each marked
/// `(active)` when a device of its UUID exists on its parent in `root`'s sysfs.
pub(super) fn list_defined(root: &Path, a: &ListArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let dir = root.join(CONFIG_DIR.trim_start_matches('/'));
    let devices = read_config_dir(&dir)
        .map_err(|e| CliError::BadArgument(format!("vgpud is not running and {e}")))?;
    let chosen = devices
        .into_iter()
        .filter(|d| {
            a.uuid
                .as_deref()
                .is_none_or(|u| same_uuid(u, &d.uuid.to_string()))
        })
        .filter(|d| a.parent.as_deref().is_none_or(|p| p == d.parent))
        .map(|d| {
            let dev = root.join("sys/bus/mdev/devices").join(d.uuid.to_string());
            let on_parent = std::fs::canonicalize(&dev).ok().is_some_and(|p| {
                p.parent()
                    .and_then(Path::file_name)
                    .is_some_and(|n| n.to_str() == Some(d.parent.as_str()))
            });
            (d, if on_parent { " (active)" } else { "" })
        })
        .collect();
    print_list(chosen, a, out)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{MdevctlProgram, run};
    use crate::cli::HostArgs;

    const U1: &str = "11111111-2222-3333-4444-555555555555";
    const U2: &str = "21111111-2222-3333-4444-555555555555";

    fn list_without_vgpud(args: &[&str]) -> Result<String, crate::cli::CliError> {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("etc/mdevctl.d/mtty");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.join(U1),
            r#"{"mdev_type":"mtty-1","start":"auto","attrs":[{"sample":"1"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.join(U2),
            r#"{"mdev_type":"mtty-2","start":"manual","attrs":[]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // U1 runs on mtty: /sys/bus/mdev/devices/U1 links to the parent's directory.
        let dev = root.path().join("sys/devices/virtual/mtty/mtty").join(U1);
        std::fs::create_dir_all(&dev).unwrap_or_else(|e| panic!("{e}"));
        let bus_devices = root.path().join("sys/bus/mdev/devices");
        std::fs::create_dir_all(&bus_devices).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&dev, bus_devices.join(U1)).unwrap_or_else(|e| panic!("{e}"));
        let host = HostArgs {
            sim: None,
            sim_journal: None,
            sysfs_root: Some(root.path().to_path_buf()),
        };
        let bus = format!("--bus=unix:path={}", root.path().join("no-bus").display());
        let mut argv = vec!["mdevctl", bus.as_str()];
        argv.extend_from_slice(args);
        let p = MdevctlProgram::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        run(&p.command, &p.bus, &host, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn list_defined_reads_the_definition_files_while_vgpud_is_away() {
        let text = list_without_vgpud(&["list", "--defined"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            text,
            format!("{U1} mtty mtty-1 auto (active)\n{U2} mtty mtty-2 manual\n")
        );
        let json = list_without_vgpud(&["list", "--defined", "--dumpjson"])
            .unwrap_or_else(|e| panic!("{e}"));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v[0]["mtty"][0][U1]["mdev_type"], "mtty-1");
        assert_eq!(v[0]["mtty"][0][U1]["attrs"][0]["sample"], "1");
        assert_eq!(v[0]["mtty"][1][U2]["start"], "manual");
    }

    #[test]
    fn changes_still_need_vgpud() {
        let e = list_without_vgpud(&["undefine", "--uuid", U2]).err();
        assert!(e.is_some_and(|e| super::daemon_absent(&e)));
        // The active list is vgpud's (libvirt learns running devices from udev).
        let e = list_without_vgpud(&["list"]).err();
        assert!(e.is_some_and(|e| super::daemon_absent(&e)));
    }
}
