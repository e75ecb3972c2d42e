//! The ResourceSlice validator of `common::openapi` against Kubernetes' OpenAPI schema and the rules
//! its descriptions state: valid slices of this driver pass, and each rule fails on a minimal bad
//! example with an error that names the path or the rule, so a validator that accepted everything
//! fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::openapi::{
    self, COUNTER, QUANTITY, QUANTITY_MAX_MILLI, RESOURCE_SLICE, RESOURCE_SLICE_LIST,
    parse_quantity, pool_rules, resource_slice_rules, validate,
};
use common::{DRIVER, NODE};
use serde_json::{Value, json};

/// The counter set of GPU `0000:01:00.0`.
const SET: &str = "gpu-0000-01-00-0";

/// A device of the devices slice: one `vdi-2g` slot of GPU `0000:01:00.0`, with attributes of each
/// kind, a capacity and the counters it consumes.
fn device(index: u32) -> Value {
    json!({
        "name": format!("gpu-0000-01-00-0-vdi-2g-{index}"),
        "attributes": {
            "profile": {"string": "vdi-2g"},
            "mdev": {"bool": true},
            "framebufferMiB": {"int": 2048},
            "driverVersion": {"version": "550.54.14"},
            "vgpu.vgpu-manager.io/pciAddress": {"string": "0000:01:00.0"}
        },
        "capacity": {
            "framebuffer": {"value": "2Gi"}
        },
        "consumesCounters": [{
            "counterSet": SET,
            "counters": {
                "framebuffer": {"value": "2Gi"},
                "slots": {"value": "1"}
            }
        }]
    })
}

/// The slice of devices: two devices that consume counters of the counters slice.
fn devices_slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": format!("{NODE}-{DRIVER}-devices"),
            "labels": {"app.kubernetes.io/managed-by": "vgpu-dra-plugin"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": NODE,
                "uid": "2c9e4c1e-6d1f-4f43-9a55-8e0a7c3d1b11", "controller": true
            }],
            "creationTimestamp": "2025-06-01T12:00:00Z",
            "resourceVersion": "17"
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 2},
            "devices": [device(0), device(1)]
        }
    })
}

/// The slice of counters: the counter set the devices consume from (a quantity as a number too).
fn counters_slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{NODE}-{DRIVER}-counters")},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 2},
            "sharedCounters": [{
                "name": SET,
                "counters": {
                    "framebuffer": {"value": "16Gi"},
                    "slots": {"value": 8}
                }
            }]
        }
    })
}

/// All errors of one slice: the schema's and the rules'.
fn slice_errors(slice: &Value) -> Vec<String> {
    let mut e = validate(RESOURCE_SLICE, slice);
    e.extend(resource_slice_rules(slice));
    e
}

/// Asserts that some error contains every one of `needles`.
#[track_caller]
fn assert_error(errs: &[String], needles: &[&str]) {
    assert!(
        errs.iter().any(|e| needles.iter().all(|n| e.contains(n))),
        "no error contains all of {needles:?}; the errors: {errs:#?}"
    );
}

/// The object at a JSON pointer, for editing a fixture.
fn at<'a>(v: &'a mut Value, pointer: &str) -> &'a mut Value {
    v.pointer_mut(pointer)
        .unwrap_or_else(|| panic!("fixture has {pointer}"))
}

// ---------------------------------------------------------------------------------------------
// The fact file
// ---------------------------------------------------------------------------------------------

#[test]
fn the_fact_file_holds_the_closure_of_resource_slice_and_nothing_else() {
    let expected = [
        "io.k8s.api.core.v1.NodeSelector",
        "io.k8s.api.core.v1.NodeSelectorRequirement",
        "io.k8s.api.core.v1.NodeSelectorTerm",
        "io.k8s.api.resource.v1.CapacityRequestPolicy",
        "io.k8s.api.resource.v1.CapacityRequestPolicyRange",
        "io.k8s.api.resource.v1.Counter",
        "io.k8s.api.resource.v1.CounterSet",
        "io.k8s.api.resource.v1.Device",
        "io.k8s.api.resource.v1.DeviceAttribute",
        "io.k8s.api.resource.v1.DeviceCapacity",
        "io.k8s.api.resource.v1.DeviceCounterConsumption",
        "io.k8s.api.resource.v1.DeviceTaint",
        "io.k8s.api.resource.v1.ResourcePool",
        "io.k8s.api.resource.v1.ResourceSlice",
        "io.k8s.api.resource.v1.ResourceSliceList",
        "io.k8s.api.resource.v1.ResourceSliceSpec",
        "io.k8s.apimachinery.pkg.api.resource.Quantity",
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
        "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta",
        "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry",
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
    ];
    assert_eq!(openapi::schema_names(), expected);
    assert_eq!(openapi::unresolved_refs(), Vec::<String>::new());
    assert_error(
        &validate("io.k8s.api.resource.v1.ResourceClaim", &json!({})),
        &["no schema io.k8s.api.resource.v1.ResourceClaim"],
    );
}

// ---------------------------------------------------------------------------------------------
// Valid slices
// ---------------------------------------------------------------------------------------------

#[test]
fn a_devices_slice_and_a_counters_slice_pass_every_check() {
    let devices = devices_slice();
    let counters = counters_slice();
    assert_eq!(slice_errors(&devices), Vec::<String>::new());
    assert_eq!(slice_errors(&counters), Vec::<String>::new());
    assert_eq!(
        pool_rules(&[devices.clone(), counters.clone()]),
        Vec::<String>::new()
    );
    let list = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "18"},
        "items": [devices, counters]
    });
    assert_eq!(validate(RESOURCE_SLICE_LIST, &list), Vec::<String>::new());
}

#[test]
fn the_largest_valid_values_pass() {
    let mut s = devices_slice();
    let d = at(&mut s, "/spec/devices/0");
    d["attributes"]["framebufferMiB"] = json!({"int": i64::MAX});
    d["attributes"]["profile"] = json!({"string": "x".repeat(64)});
    d["name"] = json!("a".repeat(63));
    // 32 attributes and capacities combined: 5 attributes + 1 capacity + 26 more.
    for k in 0..26 {
        d["attributes"][format!("extra{k}")] = json!({"bool": false});
    }
    assert_eq!(slice_errors(&s), Vec::<String>::new());

    let mut many = devices_slice();
    *at(&mut many, "/spec/devices") = Value::from(
        (0..128)
            .map(|i| json!({"name": format!("d{i}")}))
            .collect::<Vec<_>>(),
    );
    assert_eq!(slice_errors(&many), Vec::<String>::new());
}

#[test]
fn null_is_an_absent_optional_field_but_not_a_required_one() {
    let mut s = devices_slice();
    at(&mut s, "/spec")["nodeSelector"] = Value::Null;
    at(&mut s, "/metadata")["labels"] = Value::Null;
    at(&mut s, "/spec/devices/0")["taints"] = Value::Null;
    assert_eq!(slice_errors(&s), Vec::<String>::new());

    at(&mut s, "/spec")["driver"] = Value::Null;
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.spec.driver", "required property is null"],
    );
}

// ---------------------------------------------------------------------------------------------
// The schema
// ---------------------------------------------------------------------------------------------

#[test]
fn an_unknown_field_is_rejected_as_strict_field_validation_does() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0")["basic"] = json!({});
    let errs = validate(RESOURCE_SLICE, &s);
    assert_error(&errs, &["$.spec.devices[0].basic", "unknown field"]);

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/1/attributes/profile")["text"] = json!("vdi-2g");
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.spec.devices[1].attributes.profile.text", "unknown field"],
    );
}

#[test]
fn a_wrong_type_is_rejected() {
    let mut s = devices_slice();
    at(&mut s, "/spec/pool")["resourceSliceCount"] = json!("2");
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &[
            "$.spec.pool.resourceSliceCount",
            "expected integer",
            "string \"2\"",
        ],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/attributes/mdev")["bool"] = json!("true");
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.spec.devices[0].attributes.mdev.bool", "expected boolean"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec")["devices"] = json!({"name": "d0"});
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.spec.devices", "expected array"],
    );

    let mut s = counters_slice();
    at(&mut s, "/metadata")["creationTimestamp"] = json!("yesterday");
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.metadata.creationTimestamp", "RFC 3339"],
    );
}

#[test]
fn a_missing_required_property_is_rejected() {
    let mut s = devices_slice();
    at(&mut s, "/spec")
        .as_object_mut()
        .unwrap()
        .remove("driver");
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.spec.driver", "required property is missing"],
    );

    let mut s = counters_slice();
    at(&mut s, "/spec/sharedCounters/0/counters/slots")
        .as_object_mut()
        .unwrap()
        .remove("value");
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &[
            "$.spec.sharedCounters[0].counters.slots.value",
            "required property is missing",
        ],
    );
}

#[test]
fn an_int64_that_overflows_is_rejected() {
    let mut s = devices_slice();
    // 2^63, one more than i64::MAX.
    let too_big: Value = serde_json::from_str("9223372036854775808").unwrap();
    at(&mut s, "/spec/devices/0/attributes/framebufferMiB")["int"] = too_big;
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &[
            "$.spec.devices[0].attributes.framebufferMiB.int",
            "does not fit int64",
        ],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/pool")["generation"] = json!(1.5);
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &["$.spec.pool.generation", "expected integer"],
    );
}

#[test]
fn a_quantity_is_a_string_or_a_number_and_nothing_else() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/capacity/framebuffer")["value"] = json!(true);
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &[
            "$.spec.devices[0].capacity.framebuffer.value",
            "matches 0 of the 2 oneOf branches",
        ],
    );
    assert_eq!(validate(QUANTITY, &json!("1500m")), Vec::<String>::new());
    assert_eq!(validate(QUANTITY, &json!(1.5)), Vec::<String>::new());
    assert_error(&validate(QUANTITY, &json!(["1"])), &["$", "oneOf"]);
    assert_error(
        &validate(COUNTER, &json!({"value": null})),
        &["$.value", "required property is null"],
    );
}

#[test]
fn map_keys_that_are_not_identifiers_are_bracketed_in_paths() {
    let mut s = devices_slice();
    at(
        &mut s,
        "/spec/devices/0/attributes/vgpu.vgpu-manager.io~1pciAddress",
    )["string"] = json!(7);
    assert_error(
        &validate(RESOURCE_SLICE, &s),
        &[
            r#"$.spec.devices[0].attributes["vgpu.vgpu-manager.io/pciAddress"].string"#,
            "expected string",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// The rules of one slice
// ---------------------------------------------------------------------------------------------

#[test]
fn names_must_be_dns_labels() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/1")["name"] = json!("GPU_1");
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices[1].name", "not a DNS label"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/1")["name"] = json!("a".repeat(64));
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices[1].name", "more than 63"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/1")["name"] = json!("-gpu");
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices[1].name", "start and end"],
    );

    let mut s = counters_slice();
    at(&mut s, "/spec/sharedCounters/0")["name"] = json!("gpu.0");
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.sharedCounters[0].name",
            "counter set name",
            "not a DNS label",
        ],
    );

    let mut s = counters_slice();
    at(&mut s, "/spec/sharedCounters/0/counters")["Memory"] = json!({"value": "1"});
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.sharedCounters[0].counters.Memory",
            "counter name",
            "not a DNS label",
        ],
    );
}

#[test]
fn the_driver_and_the_pool_name_have_their_forms() {
    let mut s = devices_slice();
    at(&mut s, "/spec")["driver"] = json!("Vgpu.example.com");
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.driver", "not a DNS subdomain"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec")["driver"] = json!(format!("{}.example.com", "a".repeat(60)));
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.driver", "more than the 63"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/pool")["name"] = json!("rack-1/node-1");
    assert_eq!(resource_slice_rules(&s), Vec::<String>::new());
    for bad in ["rack-1//node-1", "node_1", "/node-1", &"a".repeat(254)] {
        at(&mut s, "/spec/pool")["name"] = json!(bad);
        assert_error(
            &resource_slice_rules(&s),
            &["$.spec.pool.name", "not a pool name"],
        );
    }

    let mut s = devices_slice();
    at(&mut s, "/spec/pool")["resourceSliceCount"] = json!(0);
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.pool.resourceSliceCount", "greater than zero"],
    );
}

#[test]
fn exactly_one_node_selection_is_set() {
    let mut s = devices_slice();
    at(&mut s, "/spec")["allNodes"] = json!(true);
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec", "2 of nodeName", "exactly one"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec")
        .as_object_mut()
        .unwrap()
        .remove("nodeName");
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec", "0 of nodeName", "exactly one"],
    );

    // A selector with two terms.
    let term =
        json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]});
    let mut s = devices_slice();
    let spec = at(&mut s, "/spec").as_object_mut().unwrap();
    spec.remove("nodeName");
    spec.insert(
        "nodeSelector".into(),
        json!({"nodeSelectorTerms": [term.clone(), term.clone()]}),
    );
    assert_eq!(validate(RESOURCE_SLICE, &s), Vec::<String>::new());
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.nodeSelector.nodeSelectorTerms", "exactly one term"],
    );

    // Per device: each device sets exactly one, and only then.
    let mut s = devices_slice();
    let spec = at(&mut s, "/spec").as_object_mut().unwrap();
    spec.remove("nodeName");
    spec.insert("perDeviceNodeSelection".into(), json!(true));
    at(&mut s, "/spec/devices/0")["nodeName"] = json!(NODE);
    at(&mut s, "/spec/devices/1")["allNodes"] = json!(true);
    assert_eq!(resource_slice_rules(&s), Vec::<String>::new());
    at(&mut s, "/spec/devices/1")["nodeName"] = json!(NODE);
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices[1]", "2 of nodeName", "exactly one"],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0")["allNodes"] = json!(true);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0]",
            "allNodes",
            "only if spec.perDeviceNodeSelection",
        ],
    );
}

#[test]
fn a_slice_has_at_most_128_devices_and_64_when_they_consume_counters() {
    let mut s = devices_slice();
    *at(&mut s, "/spec/devices") = Value::from(
        (0..129)
            .map(|i| json!({"name": format!("d{i}")}))
            .collect::<Vec<_>>(),
    );
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices", "129 devices, more than 128"],
    );

    let mut s = devices_slice();
    *at(&mut s, "/spec/devices") = Value::from((0..65).map(device).collect::<Vec<_>>());
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices",
            "65 devices, more than 64",
            "consumes counters",
        ],
    );
    at(&mut s, "/spec/devices").as_array_mut().unwrap().pop();
    assert_eq!(resource_slice_rules(&s), Vec::<String>::new());
}

#[test]
fn a_device_has_at_most_32_attributes_and_capacities() {
    let mut s = devices_slice();
    // 5 attributes + 1 capacity + 27 more = 33.
    for k in 0..27 {
        at(&mut s, "/spec/devices/0/attributes")[format!("extra{k}")] = json!({"int": k});
    }
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices[0]", "33 attributes and capacities", "32"],
    );
}

#[test]
fn an_attribute_has_exactly_one_value() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/attributes/profile")["int"] = json!(2);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes.profile",
            "2 of bool, int, string, version set",
            "exactly one",
        ],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/attributes")["empty"] = json!({});
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes.empty",
            "0 of bool",
            "exactly one",
        ],
    );
}

#[test]
fn string_and_version_attributes_have_at_most_64_characters() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/attributes/profile")["string"] = json!("x".repeat(65));
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes.profile.string",
            "65 characters, longer than 64",
        ],
    );

    let mut s = devices_slice();
    let long = format!("1.0.0-{}", "a".repeat(59));
    at(&mut s, "/spec/devices/0/attributes/driverVersion")["version"] = json!(long);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes.driverVersion.version",
            "65 characters",
        ],
    );

    for bad in [
        "550.54",
        "01.2.3",
        "1.2.3-",
        "1.2.3-01",
        "1.2.3+a..b",
        "v1.2.3",
    ] {
        let mut s = devices_slice();
        at(&mut s, "/spec/devices/0/attributes/driverVersion")["version"] = json!(bad);
        assert_error(
            &resource_slice_rules(&s),
            &[
                "$.spec.devices[0].attributes.driverVersion.version",
                "not a semantic version",
            ],
        );
    }
    for good in ["1.2.3", "0.0.0-rc.1+build.5", "1.2.3-0a.1-x"] {
        assert_eq!(openapi::check_semver(good), Ok(()), "{good}");
    }
}

#[test]
fn attribute_and_capacity_names_are_qualified_names_unique_in_the_drivers_domain() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/attributes")["a".repeat(33)] = json!({"bool": true});
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes.aaaa",
            "not a qualified name",
            "more than 32",
        ],
    );

    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/capacity")["frame-buffer"] = json!({"value": "1"});
    assert_error(
        &resource_slice_rules(&s),
        &[
            r#"$.spec.devices[0].capacity["frame-buffer"]"#,
            "capacity name",
            "not a qualified name",
        ],
    );

    let mut s = devices_slice();
    let domain = format!("{}.example.com", "d".repeat(52));
    at(&mut s, "/spec/devices/0/attributes")[format!("{domain}/model")] = json!({"string": "T4"});
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes",
            "64 characters, more than 63",
        ],
    );

    // `profile` is `<driver>/profile`.
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/attributes")[format!("{DRIVER}/profile")] =
        json!({"string": "vdi-2g"});
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].attributes",
            "is the same as",
            "must be unique",
        ],
    );
    assert_eq!(openapi::check_qualified_name("gpu.example.com/_x9"), Ok(()));
    assert!(openapi::check_qualified_name("a/b/c").is_err());
    assert!(openapi::check_qualified_name("9lives").is_err());
}

#[test]
fn a_slice_sets_devices_or_shared_counters_not_both() {
    let mut s = devices_slice();
    at(&mut s, "/spec")["sharedCounters"] = counters_slice()["spec"]["sharedCounters"].clone();
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec",
            "both devices (2) and sharedCounters (1)",
            "only one of devices and sharedCounters",
        ],
    );
    // Empty lists are not set.
    let mut s = counters_slice();
    at(&mut s, "/spec")["devices"] = json!([]);
    assert_eq!(resource_slice_rules(&s), Vec::<String>::new());
}

#[test]
fn shared_counters_have_their_limits_and_unique_names() {
    let mut s = counters_slice();
    let sets: Vec<Value> = (0..9)
        .map(|i| json!({"name": format!("gpu-{i}"), "counters": {"slots": {"value": "1"}}}))
        .collect();
    at(&mut s, "/spec")["sharedCounters"] = Value::from(sets);
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.sharedCounters", "9 counter sets, more than 8"],
    );

    let mut s = counters_slice();
    for k in 0..31 {
        at(&mut s, "/spec/sharedCounters/0/counters")[format!("c{k}")] = json!({"value": "1"});
    }
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.sharedCounters[0].counters",
            "33 counters, more than 32",
        ],
    );

    let mut s = counters_slice();
    let set = at(&mut s, "/spec/sharedCounters/0").clone();
    at(&mut s, "/spec/sharedCounters")
        .as_array_mut()
        .unwrap()
        .push(set);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.sharedCounters[1].name",
            "also $.spec.sharedCounters[0].name",
            "unique",
        ],
    );
}

#[test]
fn counter_consumption_has_one_entry_per_set_and_at_most_two() {
    let mut s = devices_slice();
    let c = at(&mut s, "/spec/devices/0/consumesCounters/0").clone();
    at(&mut s, "/spec/devices/0/consumesCounters")
        .as_array_mut()
        .unwrap()
        .push(c);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].consumesCounters[1].counterSet",
            "single entry per counterSet",
        ],
    );

    let mut s = devices_slice();
    let entries: Vec<Value> = (0..3)
        .map(|i| json!({"counterSet": format!("gpu-{i}"), "counters": {"slots": {"value": "1"}}}))
        .collect();
    at(&mut s, "/spec/devices/0")["consumesCounters"] = Value::from(entries);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].consumesCounters",
            "3 entries, more than the 2",
        ],
    );

    let mut s = devices_slice();
    for k in 0..31 {
        at(&mut s, "/spec/devices/0/consumesCounters/0/counters")[format!("c{k}")] =
            json!({"value": "1"});
    }
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].consumesCounters[0].counters",
            "33 counters, more than 32",
        ],
    );
}

#[test]
fn taints_have_their_limit_effects_and_forms() {
    let taint =
        json!({"key": "vgpu.vgpu-manager.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"});
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0")["taints"] = json!([taint]);
    assert_eq!(slice_errors(&s), Vec::<String>::new());

    at(&mut s, "/spec/devices/0")["taints"] = Value::from(vec![taint.clone(); 17]);
    assert_error(
        &resource_slice_rules(&s),
        &["$.spec.devices[0].taints", "17 taints, more than 16"],
    );

    for (field, bad, what) in [
        ("effect", "PreferNoSchedule", "not a valid effect"),
        ("key", "a/b/c", "not a label name"),
        ("value", "-x", "not a label value"),
    ] {
        let mut t = taint.clone();
        t[field] = json!(bad);
        let mut s = devices_slice();
        at(&mut s, "/spec/devices/0")["taints"] = json!([t]);
        assert_error(
            &resource_slice_rules(&s),
            &[&format!("$.spec.devices[0].taints[0].{field}"), what],
        );
    }
    for effect in ["None", "NoExecute"] {
        let mut t = taint.clone();
        t["effect"] = json!(effect);
        let mut s = devices_slice();
        at(&mut s, "/spec/devices/0")["taints"] = json!([t]);
        assert_eq!(resource_slice_rules(&s), Vec::<String>::new());
    }
}

#[test]
fn binding_conditions_are_at_most_four() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0")["bindingConditions"] = json!(["a", "b", "c", "d", "e"]);
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].bindingConditions",
            "5 binding conditions, more than 4",
        ],
    );
}

#[test]
fn a_request_policy_needs_multiple_allocations_and_a_consistent_default() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/capacity/framebuffer")["requestPolicy"] =
        json!({"default": "1Gi", "validValues": ["1Gi", "2Gi"]});
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].capacity.framebuffer.requestPolicy",
            "allowMultipleAllocations",
        ],
    );
    at(&mut s, "/spec/devices/0")["allowMultipleAllocations"] = json!(true);
    assert_eq!(slice_errors(&s), Vec::<String>::new());

    for (policy, needle) in [
        (
            json!({"validValues": ["1Gi"]}),
            "requestPolicy.default: missing",
        ),
        (
            json!({"default": "512Mi", "validValues": ["1Gi"]}),
            "not one of validValues",
        ),
        (
            json!({"default": "1Gi", "validValues": ["2Gi", "1Gi"]}),
            "not sorted",
        ),
        (
            json!({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}}),
            "both validValues and validRange",
        ),
        (
            json!({"default": "1Gi", "validRange": {"min": "-1"}}),
            "validRange.min: less than zero",
        ),
        (
            json!({"default": "1Gi", "validRange": {"min": "1Gi", "max": "4Gi"}}),
            "max: more than the capacity",
        ),
        (
            json!({"default": "512Mi", "validRange": {"min": "1Gi"}}),
            "less than validRange.min",
        ),
        (
            json!({"default": "1Gi", "validRange": {"min": "1Gi", "step": "2Gi"}}),
            "min + step",
        ),
    ] {
        let mut s = devices_slice();
        at(&mut s, "/spec/devices/0")["allowMultipleAllocations"] = json!(true);
        at(&mut s, "/spec/devices/0/capacity/framebuffer")["requestPolicy"] = policy;
        assert_error(&resource_slice_rules(&s), &[needle]);
    }
}

#[test]
fn a_bad_quantity_is_rejected_by_the_slice_rules() {
    let mut s = devices_slice();
    at(&mut s, "/spec/devices/0/capacity/framebuffer")["value"] = json!("12Q");
    // The schema accepts any string; the grammar does not.
    assert_eq!(validate(RESOURCE_SLICE, &s), Vec::<String>::new());
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.devices[0].capacity.framebuffer.value",
            "\"12Q\" is not a quantity",
        ],
    );

    let mut s = counters_slice();
    at(&mut s, "/spec/sharedCounters/0/counters/slots")["value"] = json!("1.5.0");
    assert_error(
        &resource_slice_rules(&s),
        &[
            "$.spec.sharedCounters[0].counters.slots.value",
            "not a quantity",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// The rules of a pool
// ---------------------------------------------------------------------------------------------

#[test]
fn a_consumed_counter_set_must_exist_in_the_pool() {
    let mut d = devices_slice();
    at(&mut d, "/spec/devices/1/consumesCounters/0")["counterSet"] = json!("gpu-0000-02-00-0");
    let errs = pool_rules(&[d, counters_slice()]);
    assert_error(
        &errs,
        &[
            "$[0].spec.devices[1].consumesCounters[0].counterSet",
            "\"gpu-0000-02-00-0\"",
            "no slice of pool",
        ],
    );

    let mut d = devices_slice();
    at(&mut d, "/spec/devices/0/consumesCounters/0/counters")["bandwidth"] = json!({"value": "1"});
    assert_error(
        &pool_rules(&[d, counters_slice()]),
        &[
            "$[0].spec.devices[0].consumesCounters[0].counters.bandwidth",
            "not a counter of counter set",
        ],
    );

    // A set of another driver's pool of the same name does not count.
    let mut c = counters_slice();
    at(&mut c, "/spec")["driver"] = json!("other.example.com");
    at(&mut c, "/spec/pool")["resourceSliceCount"] = json!(1);
    assert_error(
        &pool_rules(&[devices_slice(), c]),
        &["$[0].spec.devices[0].consumesCounters[0].counterSet"],
    );
}

#[test]
fn device_and_counter_set_names_are_unique_in_the_pool() {
    let mut other = devices_slice();
    at(&mut other, "/spec")["devices"] = json!([device(1)]);
    let mut pool = [devices_slice(), counters_slice(), other];
    for s in &mut pool {
        at(s, "/spec/pool")["resourceSliceCount"] = json!(3);
    }
    let errs = pool_rules(&pool);
    assert_error(
        &errs,
        &[
            "$[2].spec.devices[0].name",
            "also $[0].spec.devices[1].name",
            "unique name",
        ],
    );

    let mut pool = [devices_slice(), counters_slice(), counters_slice()];
    for s in &mut pool {
        at(s, "/spec/pool")["resourceSliceCount"] = json!(3);
    }
    assert_error(
        &pool_rules(&pool),
        &[
            "$[2].spec.sharedCounters[0].name",
            "also $[1].spec.sharedCounters[0].name",
            "unique",
        ],
    );
}

#[test]
fn the_slice_count_and_generation_agree_across_the_pool() {
    let mut c = counters_slice();
    at(&mut c, "/spec/pool")["resourceSliceCount"] = json!(3);
    let errs = pool_rules(&[devices_slice(), c]);
    assert_error(
        &errs,
        &[
            "$[1].spec.pool.resourceSliceCount",
            "Some(3)",
            "has 2 slices",
        ],
    );
    assert_error(
        &pool_rules(&[devices_slice()]),
        &["$[0].spec.pool.resourceSliceCount", "has 1 slices"],
    );

    let mut c = counters_slice();
    at(&mut c, "/spec/pool")["generation"] = json!(2);
    assert_error(
        &pool_rules(&[devices_slice(), c]),
        &["different spec.pool.generation"],
    );
}

#[test]
fn a_consumed_value_must_be_a_quantity() {
    let mut d = devices_slice();
    at(&mut d, "/spec/devices/0/consumesCounters/0/counters/slots")["value"] = json!("12Q");
    let errs = pool_rules(&[d.clone(), counters_slice()]);
    assert_error(
        &errs,
        &[
            "$[0].spec.devices[0].consumesCounters[0].counters.slots.value",
            "\"12Q\" is not a quantity",
        ],
    );
    assert_error(
        &resource_slice_rules(&d),
        &[
            "$.spec.devices[0].consumesCounters[0].counters.slots.value",
            "not a quantity",
        ],
    );

    let mut d = devices_slice();
    at(&mut d, "/spec/devices/0/consumesCounters/0/counters/slots")["value"] = json!({"n": 1});
    assert_error(
        &pool_rules(&[d, counters_slice()]),
        &[
            "$[0].spec.devices[0].consumesCounters[0].counters.slots.value",
            "oneOf",
        ],
    );
}

#[test]
fn what_devices_could_consume_together_is_not_compared_with_the_counters() {
    let mut c = counters_slice();
    at(&mut c, "/spec/sharedCounters/0/counters/framebuffer")["value"] = json!("2Gi");
    assert_eq!(pool_rules(&[devices_slice(), c]), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Quantities and odd input
// ---------------------------------------------------------------------------------------------

#[test]
fn quantities_parse_in_the_kubernetes_grammar() {
    let milli = |s: &str| parse_quantity(s).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(milli("1"), 1000);
    assert_eq!(milli("+1"), 1000);
    assert_eq!(milli("-1.5"), -1500);
    assert_eq!(milli("1."), 1000);
    assert_eq!(milli(".5"), 500);
    assert_eq!(milli("1500m"), 1500);
    assert_eq!(milli("0.1m"), 1); // rounded up
    assert_eq!(milli("2Ki"), 2048 * 1000);
    assert_eq!(milli("1.5Gi"), 1536 * 1024 * 1024 * 1000);
    assert_eq!(milli("16Gi"), 16 * (1 << 30) * 1000);
    assert_eq!(milli("1Ei"), (1_i128 << 60) * 1000);
    assert_eq!(milli("3k"), 3_000_000);
    assert_eq!(milli("2M"), 2_000_000_000);
    assert_eq!(milli("1G"), 1_000_000_000_000);
    assert_eq!(milli("1T"), 1_000_000_000_000_000);
    assert_eq!(milli("1P"), 1_000_000_000_000_000_000);
    assert_eq!(milli("1E"), 1_000_000_000_000_000_000_000);
    assert_eq!(milli("1e3"), 1_000_000);
    assert_eq!(milli("1E3"), 1_000_000);
    assert_eq!(milli("12e-1"), 1200);
    assert_eq!(milli("5e+0"), 5000);
    assert_eq!(milli("0"), 0);
    assert_eq!(milli("000.000"), 0);
    assert_eq!(milli("10E"), QUANTITY_MAX_MILLI); // capped at 2^63-1
    assert_eq!(milli("1e100000000"), QUANTITY_MAX_MILLI);
    assert_eq!(milli("1e-100000000"), 1);
    for bad in [
        "", "12Q", "1.5.0", "Gi", "-", ".", "1 Gi", "1gi", "1KiB", "e3", "1e", "1e+", "1e1.5",
        "1.5e", "--1", "0x10", " 1", "1i",
    ] {
        assert!(parse_quantity(bad).is_err(), "{bad:?} parsed");
    }
    assert_eq!(openapi::quantity_value(&json!(8)), Ok(8000));
    assert_eq!(openapi::quantity_value(&json!(0.25)), Ok(250));
    assert!(openapi::quantity_value(&json!(null)).is_err());
}

#[test]
fn odd_input_gives_errors_not_panics() {
    let odd = [
        json!(null),
        json!(7),
        json!("slice"),
        json!([]),
        json!({"spec": "x"}),
        json!({"spec": {"devices": {"a": 1}, "sharedCounters": 3, "pool": []}}),
        json!({"spec": {"devices": [null, 1, {"name": 5, "attributes": [], "capacity": {"x": 1},
            "consumesCounters": [null, {"counterSet": 1, "counters": {"a": null}}],
            "taints": [{"effect": 1}], "nodeSelector": {"nodeSelectorTerms": {}}}]}}),
        json!({"spec": {"driver": "", "pool": {"name": "", "resourceSliceCount": -1}}}),
    ];
    for v in &odd {
        assert!(
            !validate(RESOURCE_SLICE, v).is_empty(),
            "{v} passed the schema"
        );
        let _ = resource_slice_rules(v);
    }
    assert_error(
        &resource_slice_rules(&json!(null)),
        &["$.spec", "missing or not an object"],
    );
    let errs = pool_rules(&odd);
    assert_error(&errs, &["$[0]", "belongs to no pool"]);
    assert_eq!(pool_rules(&[]), Vec::<String>::new());
}
