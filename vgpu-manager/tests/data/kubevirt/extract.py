#!/usr/bin/env python3
"""Writes the KubeVirt CRD schema fact files of this directory from kubevirt/kubevirt's generated CRD.

    git -C KUBEVIRT show TAG:manifests/generated/kv-resource.yaml > kv-resource.yaml
    python3 extract.py kv-resource.yaml TAG COMMIT > kubevirt-TAG.json

Keeps, of the v1 openAPIV3Schema of CRD kubevirts.kubevirt.io, the root's apiVersion, kind and metadata
and, under spec.configuration, developerConfiguration.featureGates, mediatedDevicesConfiguration and
permittedHostDevices as they are; every other property is dropped (vgpuctl export kubevirt writes none).
Needs PyYAML.
"""
import json
import sys

import yaml


def main():
    path, tag, commit = sys.argv[1:4]
    with open(path) as f:
        crd = yaml.safe_load(f)
    assert crd["metadata"]["name"] == "kubevirts.kubevirt.io"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    root = version["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]
    conf = spec["properties"]["configuration"]
    dev = conf["properties"]["developerConfiguration"]
    kept_conf = {
        "developerConfiguration": {
            "type": dev["type"],
            "properties": {"featureGates": dev["properties"]["featureGates"]},
        },
        "permittedHostDevices": conf["properties"]["permittedHostDevices"],
    }
    if "mediatedDevicesConfiguration" in conf["properties"]:
        kept_conf["mediatedDevicesConfiguration"] = conf["properties"]["mediatedDevicesConfiguration"]
    schema = {
        "type": root["type"],
        "properties": {
            "apiVersion": root["properties"]["apiVersion"],
            "kind": root["properties"]["kind"],
            "metadata": root["properties"]["metadata"],
            "spec": {
                "type": spec["type"],
                "properties": {"configuration": {"type": conf["type"], "properties": kept_conf}},
            },
        },
    }
    out = {
        "source": {
            "url": f"https://github.com/kubevirt/kubevirt/blob/{tag}/manifests/generated/kv-resource.yaml",
            "repository": "https://github.com/kubevirt/kubevirt",
            "tag": tag,
            "commit": commit,
            "crd": "kubevirts.kubevirt.io",
            "path": "spec.versions[name=v1].schema.openAPIV3Schema",
            "kept": "apiVersion, kind, metadata; spec.configuration.{developerConfiguration.featureGates, "
            "mediatedDevicesConfiguration, permittedHostDevices}; other properties dropped",
        },
        "schema": schema,
    }
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


main()
