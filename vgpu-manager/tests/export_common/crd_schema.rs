//! A checker of a JSON document against a CRD's structural OpenAPI v3 schema, as the Kubernetes API
//! server checks a custom resource with strict field validation (`kubectl apply`'s default since
//! Kubernetes 1.27; k8s.io/apiextensions-apiserver pkg/apiserver/schema): a field the schema does not
//! list is an error (the server would refuse it, or prune it and so drop it silently), as is a wrong
//! type, a missing required field, or a duplicate in a `set` list. Only the keywords the stored
//! schemas use are known; any other keyword fails the check, so a schema regenerated with more is not
//! half-checked.

use serde_json::Value;

/// Every problem of `doc` under `schema`, each naming its JSON path; empty when it conforms.
pub fn check(schema: &Value, doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    walk(schema, doc, "", &mut problems);
    problems
}

const KNOWN: &[&str] = &[
    "type",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "description",
    "x-kubernetes-list-type",
];

fn walk(schema: &Value, doc: &Value, path: &str, problems: &mut Vec<String>) {
    let s = schema.as_object().expect("a schema is an object");
    for k in s.keys() {
        assert!(
            KNOWN.contains(&k.as_str()),
            "schema at {path}: keyword {k} is not implemented by this checker"
        );
    }
    let ty = s.get("type").and_then(Value::as_str);
    let ok = match ty {
        Some("object") => doc.is_object(),
        Some("array") => doc.is_array(),
        Some("string") => doc.is_string(),
        Some("boolean") => doc.is_boolean(),
        Some("integer") => doc.is_i64() || doc.is_u64(),
        Some("number") => doc.is_number(),
        Some(other) => panic!("schema at {path}: type {other} is not implemented"),
        None => true,
    };
    if !ok {
        problems.push(format!("{path}: expected {}, got {doc}", ty.unwrap_or("?")));
        return;
    }
    if let Some(obj) = doc.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        let additional = s.get("additionalProperties");
        for (k, v) in obj {
            let here = format!("{path}.{k}");
            match (props.and_then(|p| p.get(k)), additional) {
                (Some(sub), _) => walk(sub, v, &here, problems),
                (None, Some(sub)) => walk(sub, v, &here, problems),
                // An object schema without properties (metadata: ObjectMeta) takes any field.
                (None, None) if props.is_none() => {}
                (None, None) => problems.push(format!("{here}: unknown field")),
            }
        }
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().expect("required lists names");
            if !obj.contains_key(r) {
                problems.push(format!("{path}: required field {r} is missing"));
            }
        }
    }
    if let Some(items) = doc.as_array() {
        if let Some(sub) = s.get("items") {
            for (i, v) in items.iter().enumerate() {
                walk(sub, v, &format!("{path}[{i}]"), problems);
            }
        }
        match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
            None | Some("atomic") => {}
            Some("set") => {
                for (i, v) in items.iter().enumerate() {
                    if items[..i].contains(v) {
                        problems.push(format!("{path}[{i}]: duplicate in a set list"));
                    }
                }
            }
            Some(other) => panic!("schema at {path}: list type {other} is not implemented"),
        }
    }
}
