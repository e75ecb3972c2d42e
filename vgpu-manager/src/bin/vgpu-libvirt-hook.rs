//! `vgpu-libvirt-hook`: libvirt's QEMU hook for on-demand vGPUs (see `vgpu_manager::hook`). Install it as
//! `/etc/libvirt/hooks/qemu.d/vgpu-manager` (executable) and restart libvirtd/virtqemud so it is picked up.
//! The bus is `VGPU_BUS` (default `system`). Exit status: 0 on success or for ignored operations, 1 when
//! a device could not be prepared (libvirt then refuses to start the domain and shows the message).

use std::io::Read;
use std::process::ExitCode;

use vgpu_client::{BusAddress, blocking};
use vgpu_host::{Host, SysfsHost, paths};
use vgpu_manager::hook::{HOOK_NAME, Invocation, run};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let inv = match Invocation::from_args(&args) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{HOOK_NAME}: {e}");
            return ExitCode::from(2);
        }
    };
    let bus = std::env::var("VGPU_BUS").unwrap_or_else(|_| "system".into());
    let read_stdin = || {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map(|_| s)
    };
    let connect = || blocking::Client::connect_unchecked(&bus.parse::<BusAddress>()?);
    // Only asked when vgpud is unreachable: are the domain's mdevs there anyway (made by mdevctl)?
    let sysfs = SysfsHost::new("/").ok();
    let exists = |u: &mdev_types::ids::MdevUuid| {
        sysfs
            .as_ref()
            .is_some_and(|h| h.exists(&paths::mdev_device(u)))
    };
    match run(&inv, read_stdin, connect, exists) {
        Ok(steps) => {
            for s in steps {
                eprintln!("{HOOK_NAME}: {} {} {}: {s}", inv.domain, inv.op, inv.subop);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{HOOK_NAME}: {e}");
            ExitCode::FAILURE
        }
    }
}
