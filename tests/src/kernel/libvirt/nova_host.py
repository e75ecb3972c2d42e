"""OpenStack Nova's libvirt driver managing one mdev on this host, for tests/src/kernel/libvirt/nova.rs.

Runs Nova's installed code (the test virtualenv of scripts/nova-venv) against libvirtd: a
nova.virt.libvirt.driver.LibvirtDriver built as nova-compute builds it (nova/cmd/compute.py: native
threading, then nova.config.parse_args; here without RPC and database, which no step below uses), its
init_host, and the driver's and its Host's mdev methods. No Nova code is copied: every step calls Nova.

Protocol: one JSON object per line on stdout per phase ("created", "stopped", "restarted", "deleted"),
each followed by a wait for one line on stdin (the test checks sysfs and vgpud in between). On an
error: a last line {"phase": "error", "step": ..., "error": ..., "traceback": ...} and exit status 1.
Nova's log (and anything else written to stdout) goes to stderr.

usage: nova_host.py --uri URI --parent NODEDEV --type MDEV_TYPE --uuid UUID --work DIR
"""

# nova-compute's first statement (nova/cmd/compute.py): native threading, no eventlet.
from nova import monkey_patch

monkey_patch.patch(backend="threading")

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

STEP = "import"
# The phases go to the real stdout; whatever else writes to stdout (oslo.log's default handler,
# libvirt's C library) goes to stderr with Nova's log.
OUT = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit(obj):
    OUT.write(json.dumps(obj, sort_keys=True, default=sorted) + "\n")
    OUT.flush()


def wait_for_test():
    if not sys.stdin.readline():
        raise RuntimeError("the test closed stdin before the next phase")


def step(name):
    global STEP
    STEP = name


def poll(what, check, within=30.0):
    """Calls check() until it returns a true value; that value and the seconds it took."""
    start = time.monotonic()
    while True:
        got = check()
        if got:
            return got, round(time.monotonic() - start, 3)
        if time.monotonic() - start > within:
            raise RuntimeError("%s: not within %s s" % (what, within))
        time.sleep(0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--parent", required=True)
    p.add_argument("--type", required=True)
    p.add_argument("--uuid", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()

    step("import nova")
    import libvirt
    import nova.conf
    from nova import config
    from nova import objects
    from nova import version
    from nova.virt import virtapi
    from nova.virt.libvirt import driver
    from oslo_log import log as logging

    # The options nova.conf has for one mdev type on one parent ([devices] enabled_mdev_types,
    # [mdev_<type>] device_addresses: nova/conf/devices.py); Nova takes a parent that is no PCI
    # device by its libvirt name when /sys/devices/virtual/<name with / for _> exists
    # (driver.py, LibvirtDriver._validate_device_address).
    conf_path = os.path.join(a.work, "nova.conf")
    conf_text = (
        "[DEFAULT]\n"
        "state_path = {work}/nova\n"
        "instances_path = {work}/nova/instances\n"
        "[oslo_concurrency]\n"
        "lock_path = {work}/nova/locks\n"
        "[libvirt]\n"
        "connection_uri = {uri}\n"
        "virt_type = qemu\n"
        "[devices]\n"
        "enabled_mdev_types = {type}\n"
        "[mdev_{type}]\n"
        "device_addresses = {parent}\n"
    ).format(work=a.work, uri=a.uri, type=a.type, parent=a.parent)
    with open(conf_path, "w") as f:
        f.write(conf_text)

    step("nova.config.parse_args")
    config.parse_args(
        ["nova-compute", "--config-file", conf_path],
        default_config_files=[],
        configure_db=False,
        init_rpc=False,
    )
    logging.setup(nova.conf.CONF, "nova")
    objects.register_all()

    step("LibvirtDriver()")
    drv = driver.LibvirtDriver(virtapi.VirtAPI(), read_only=False)
    host = drv._host
    step("LibvirtDriver.init_host")
    drv.init_host(host="nova-test-guest")

    out = {
        "phase": "created",
        "nova_version": version.version_string(),
        "libvirt_python": libvirt.getVersion(),
        "uri": host._uri,
        "nova_conf": conf_text,
    }
    step("Host.get_connection().getLibVersion")
    out["libvirt_daemon"] = host.get_connection().getLibVersion()
    step("Host.list_mdev_capable_devices")
    out["mdev_capable_devices"] = host.list_mdev_capable_devices()
    step("LibvirtDriver._get_mdev_capable_devices")
    out["capable_before"] = drv._get_mdev_capable_devices()
    out["supported_vgpu_types"] = list(drv.supported_vgpu_types)
    out["virtual_mdevs"] = sorted(drv.virtual_mdevs)
    step("LibvirtDriver._get_supported_mdev_resource_classes")
    out["resource_classes"] = sorted(drv._get_supported_mdev_resource_classes())
    step("LibvirtDriver._get_gpu_inventories")
    out["inventories_before"] = drv._get_gpu_inventories()
    step("Host.list_mediated_devices")
    out["mediated_before"] = host.list_mediated_devices()

    step("LibvirtDriver._create_new_mediated_device")
    out["created_uuid"] = drv._create_new_mediated_device(a.parent, uuid=a.uuid)
    step("Host.list_mediated_devices")
    out["mediated_after"], out["listed_after_s"] = poll(
        "libvirt lists the new mdev", host.list_mediated_devices
    )
    step("LibvirtDriver._get_mediated_devices")
    out["mediated_info"] = drv._get_mediated_devices()
    step("LibvirtDriver._get_existing_mdevs_not_assigned")
    out["not_assigned"] = sorted(
        drv._get_existing_mdevs_not_assigned(a.parent, drv.supported_vgpu_types)
    )
    step("LibvirtDriver._get_gpu_inventories")
    out["inventories_after"] = drv._get_gpu_inventories()
    step("Host.device_lookup_by_name")
    names = out["mediated_after"]
    dev = host.device_lookup_by_name(names[0])
    out["node"] = {
        "name": dev.name(),
        "parent": dev.parent(),
        "active": bool(dev.isActive()),
        "persistent": bool(dev.isPersistent()),
        "autostart": bool(dev.autostart()),
    }
    emit(out)
    wait_for_test()

    # Nova never stops or deletes an mdev (no nodeDevice destroy or undefine in nova/virt/libvirt);
    # what stops one here is libvirt's virNodeDevice.destroy() on the device Nova's Host looked up,
    # as a host reboot or an operator would. Nova's init_host then starts the inactive definitions
    # (LibvirtDriver._start_inactive_mediated_devices: Host.list_all_devices, Host.device_start).
    mdev_flags = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV
    inactive = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE | mdev_flags
    active = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE | mdev_flags

    def names_of(flags):
        return sorted(d.name() for d in host.list_all_devices(flags))

    step("virNodeDevice.destroy")
    dev.destroy()
    step("Host.list_all_devices(INACTIVE | CAP_MDEV)")
    out = {"phase": "stopped"}
    out["inactive"], out["inactive_after_s"] = poll(
        "libvirt lists the stopped mdev as inactive", lambda: names_of(inactive)
    )
    out["active"] = names_of(active)
    # Host.list_mediated_devices is libvirt's listDevices("mdev"), which also names defined,
    # inactive devices.
    out["mediated"] = host.list_mediated_devices()
    emit(out)
    wait_for_test()

    step("LibvirtDriver._start_inactive_mediated_devices")
    drv._start_inactive_mediated_devices()
    out = {"phase": "restarted"}
    step("Host.list_all_devices(ACTIVE | CAP_MDEV)")
    out["active"], out["listed_after_s"] = poll(
        "libvirt lists the restarted mdev as active", lambda: names_of(active)
    )
    out["inactive"] = names_of(inactive)
    step("Host.list_mediated_devices")
    out["mediated"] = host.list_mediated_devices()
    step("LibvirtDriver._get_mediated_devices")
    out["mediated_info"] = drv._get_mediated_devices()
    emit(out)
    wait_for_test()

    # Deletion: libvirt's API on the device Nova's Host looked up (Nova has no call for it).
    step("Host.device_lookup_by_name")
    dev = host.device_lookup_by_name(names[0])
    step("virNodeDevice.destroy")
    dev.destroy()
    step("virNodeDevice.undefine")
    dev.undefine()
    out = {"phase": "deleted"}
    step("Host.list_all_devices(CAP_MDEV)")
    _, out["gone_after_s"] = poll(
        "libvirt drops the deleted mdev", lambda: names_of(mdev_flags) == []
    )
    out["all_mdevs"] = names_of(mdev_flags)
    step("Host.list_mediated_devices")
    out["mediated"] = host.list_mediated_devices()
    step("LibvirtDriver._get_mediated_devices")
    out["mediated_info"] = drv._get_mediated_devices()
    step("LibvirtDriver._get_mdev_capable_devices")
    out["capable"] = drv._get_mdev_capable_devices()
    step("LibvirtDriver._get_gpu_inventories")
    out["inventories"] = drv._get_gpu_inventories()
    emit(out)


if __name__ == "__main__":
    status = 0
    try:
        main()
    except BaseException as e:  # noqa: B902 - reported to the test, whatever it is
        emit(
            {
                "phase": "error",
                "step": STEP,
                "error": "%s: %s" % (type(e).__name__, e),
                "traceback": traceback.format_exc(),
            }
        )
        status = 1
    OUT.flush()
    sys.stderr.flush()
    # Host.initialize (from init_host) starts libvirt's event loop and Nova's dispatch threads,
    # which never end: leave without waiting for them.
    os._exit(status)
