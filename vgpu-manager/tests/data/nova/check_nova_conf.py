#!/usr/bin/env python3
"""Reads a nova.conf with Nova's own option definitions and prints, as JSON, what Nova reads from it.

    python check_nova_conf.py FILE

Registers nova.conf.devices and nova.conf.pci on an oslo.config ConfigOpts, parses FILE with
--config-file, registers the [mdev_<type>] groups as nova-compute does
(nova.conf.devices.register_dynamic_opts), and reads every value back: a value of the wrong kind fails
there (mdev_class against its regex, max_instances as an integer of at least 1). oslo.config itself
ignores options it does not know, so every option of FILE is also looked up among the registered ones:
an unknown name fails. Each [pci] device_spec is parsed by Nova's own parser (nova.pci.devspec, which
refuses unknown address forms and bad tag values) and each [pci] alias is checked against Nova's alias
schema (nova.pci.request). Exit code 1 with the reason on stderr when anything fails.
Run with the Python of .cache/nova-venv (scripts/nova-venv).
"""
import json
import sys

from oslo_config import cfg

import nova.conf.devices
import nova.conf.pci


def main(path):
    conf = cfg.ConfigOpts()
    nova.conf.devices.register_opts(conf)
    nova.conf.pci.register_opts(conf)
    conf(args=["--config-file", path], project="nova", default_config_files=[], default_config_dirs=[])
    nova.conf.devices.register_dynamic_opts(conf)

    # Every option in the file must be one Nova defines (oslo.config would ignore a misspelt one).
    sections = {}
    cfg.ConfigParser(path, sections).parse()
    unknown = []
    for section, opts in sections.items():
        group = None if section == "DEFAULT" else section
        for name in opts:
            try:
                conf._get_opt_info(name, group)
            except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
                unknown.append(f"[{section}] {name}")
    if unknown:
        sys.exit(f"options Nova does not define: {', '.join(unknown)}")

    out = {
        "enabled_mdev_types": list(conf.devices.enabled_mdev_types),
        "mdev": {},
        "device_spec": [],
        "alias": [],
        "sections": sorted(sections),
    }
    for ty in conf.devices.enabled_mdev_types:
        g = getattr(conf, f"mdev_{ty}")
        out["mdev"][ty] = {
            "device_addresses": list(g.device_addresses),
            "mdev_class": g.mdev_class,
            "max_instances": g.max_instances,
        }

    # Nova's own parsers of the JSON values (nova/pci/devspec.py, nova/pci/request.py).
    from nova.pci import devspec
    from nova.pci import request
    import jsonschema

    for text in conf.pci.device_spec:
        spec = json.loads(text)
        parsed = devspec.PciDeviceSpec(dict(spec))
        out["device_spec"].append({"spec": spec, "tags": parsed.get_tags()})
    for text in conf.pci.alias:
        alias = json.loads(text)
        jsonschema.validate(alias, request._ALIAS_SCHEMA)
        out["alias"].append(alias)
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
