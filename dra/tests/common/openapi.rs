//! `resource.k8s.io/v1` ResourceSlice objects checked against Kubernetes' own OpenAPI v3 schema (the
//! fact file `tests/data/k8s/resourceslice-v1.openapi.json`; `SOURCE.md` next to it names the
//! Kubernetes file and commit it comes from) and against the validation rules that schema's
//! descriptions state in words.
//!
//! - [`validate`]: the schema itself (`$ref`, `allOf`, `oneOf`, `enum`, `type`, `format`,
//!   `properties`, `required`, `additionalProperties`, `items`).
//! - [`resource_slice_rules`]: the rules of one ResourceSlice the descriptions state (DNS labels,
//!   limits, exactly-one-of fields, quantities).
//! - [`pool_rules`]: the rules across all slices of one pool (generation, slice count, unique names,
//!   counter references).
//!
//! Every function returns every violation as text naming the JSON path (`$.spec.devices[3].name`;
//! map keys that are not plain identifiers in brackets, `attributes["gpu.example.com/model"]`) and
//! what is wrong; an empty list means valid. Odd input (wrong types anywhere) gives errors, never a
//! panic.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// Where the fact file is.
pub const FACT_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/k8s/resourceslice-v1.openapi.json"
);
/// The schema of a ResourceSlice.
pub const RESOURCE_SLICE: &str = "io.k8s.api.resource.v1.ResourceSlice";
/// The schema of a ResourceSliceList.
pub const RESOURCE_SLICE_LIST: &str = "io.k8s.api.resource.v1.ResourceSliceList";
/// The schema of a Quantity.
pub const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
/// The schema of a Counter (`{"value": <Quantity>}`).
pub const COUNTER: &str = "io.k8s.api.resource.v1.Counter";

/// How a `$ref` names a schema of the file.
const REF_PREFIX: &str = "#/components/schemas/";
/// Deeper than any schema of the file nests; only a `$ref` loop reaches it.
const MAX_DEPTH: usize = 64;

/// The fact file's `components.schemas`, read once.
fn schemas() -> Result<&'static Map<String, Value>, String> {
    static DOC: OnceLock<Result<Value, String>> = OnceLock::new();
    let doc = DOC.get_or_init(|| {
        let text = std::fs::read_to_string(FACT_FILE).map_err(|e| format!("{FACT_FILE}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{FACT_FILE}: {e}"))
    });
    match doc {
        Ok(doc) => doc
            .get("components")
            .and_then(|c| c.get("schemas"))
            .and_then(Value::as_object)
            .ok_or_else(|| format!("{FACT_FILE}: no components.schemas object")),
        Err(e) => Err(e.clone()),
    }
}

/// The names of the schemas in the fact file, sorted.
pub fn schema_names() -> Vec<String> {
    schemas()
        .map(|s| s.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every `$ref` in the fact file that does not name a schema of the file, or the error loading it.
pub fn unresolved_refs() -> Vec<String> {
    fn walk(v: &Value, all: &Map<String, Value>, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, v) in o {
                    if k == "$ref" {
                        let known = v
                            .as_str()
                            .and_then(|r| r.strip_prefix(REF_PREFIX))
                            .is_some_and(|n| all.contains_key(n));
                        if !known {
                            out.push(v.to_string());
                        }
                    } else {
                        walk(v, all, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, all, out)),
            _ => {}
        }
    }
    match schemas() {
        Ok(all) => {
            let mut out = Vec::new();
            for s in all.values() {
                walk(s, all, &mut out);
            }
            out
        }
        Err(e) => vec![e],
    }
}

// ---------------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------------

/// `path.key`, or `path["key"]` when the key is not a plain identifier.
fn key(path: &str, k: &str) -> String {
    let plain = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        format!("{path}.{k}")
    } else {
        format!("{path}[{}]", Value::from(k))
    }
}

/// `path[i]`.
fn idx(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// A short account of a JSON value for an error.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) if s.chars().count() > 40 => {
            format!("a string of {} characters", s.chars().count())
        }
        Value::String(s) => format!("string {s:?}"),
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// The schema
// ---------------------------------------------------------------------------------------------

/// Every violation of the fact file's schema `kind` (such as [`RESOURCE_SLICE`]) by `value`.
///
/// Supports what the file's schemas use: `$ref` (also wrapped as `allOf: [{$ref}]`), `allOf`,
/// `oneOf` (exactly one branch valid: a Quantity is a string or a number), `enum`, `type`
/// (object, array, string, integer, boolean, number), `format` (`int64`: an integer that fits
/// i64; `int32` likewise; `date-time`: RFC 3339), `properties`, `required`,
/// `additionalProperties` (the schema of a map's values) and `items`. `default` and the
/// `x-kubernetes-*` extensions describe defaulting and merging, not validity, and are not checked.
///
/// A property that is not in `properties` of an object schema without `additionalProperties` is an
/// error: the API server's strict field validation (`fieldValidation=Strict`, what kubectl 1.27 and
/// later sends by default) rejects unknown fields. An object schema with neither `properties` nor
/// `additionalProperties` (`FieldsV1`) is free-form.
///
/// `null` is accepted for an optional property and rejected for a required one: Kubernetes' JSON
/// decoder treats `null` like an absent field. Elsewhere (an array item, a map value) `null` must
/// match the schema like any value.
pub fn validate(kind: &str, value: &Value) -> Vec<String> {
    validate_at(kind, value, "$")
}

/// [`validate`] with the errors' paths starting at `path` instead of `$`.
pub fn validate_at(kind: &str, value: &Value, path: &str) -> Vec<String> {
    let mut errs = Vec::new();
    match schemas() {
        Ok(all) => match all.get(kind) {
            Some(schema) => check(schema, value, path, 0, &mut errs),
            None => errs.push(format!("{path}: no schema {kind} in {FACT_FILE}")),
        },
        Err(e) => errs.push(format!("{path}: cannot load the schema: {e}")),
    }
    errs
}

/// The schema a `$ref` names.
fn resolve(r: &Value) -> Result<&'static Value, String> {
    let all = schemas()?;
    r.as_str()
        .and_then(|r| r.strip_prefix(REF_PREFIX))
        .and_then(|n| all.get(n))
        .ok_or_else(|| format!("$ref {r} names no schema of {FACT_FILE}"))
}

/// Whether `v` is of the schema type `t`.
fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "number" => v.is_number(),
        // A number too large for u64 arrives as a float; it is an integer (that fits no format).
        "integer" => {
            v.is_i64()
                || v.is_u64()
                || v.as_f64()
                    .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
        }
        _ => true,
    }
}

/// Adds to `errs` every violation of `schema` by `value` at `path`.
fn check(schema: &Value, value: &Value, path: &str, depth: usize, errs: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        if schema.as_bool() == Some(false) {
            errs.push(format!("{path}: no value is allowed here"));
        }
        return;
    };
    if depth > MAX_DEPTH {
        errs.push(format!(
            "{path}: the schema nests deeper than {MAX_DEPTH} (a $ref loop)"
        ));
        return;
    }
    // OpenAPI 3.0: a $ref stands for the whole schema; its siblings are ignored.
    if let Some(r) = s.get("$ref") {
        match resolve(r) {
            Ok(target) => check(target, value, path, depth + 1, errs),
            Err(e) => errs.push(format!("{path}: {e}")),
        }
        return;
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for branch in all {
            check(branch, value, path, depth + 1, errs);
        }
    }
    if let Some(one) = s.get("oneOf").and_then(Value::as_array) {
        let results: Vec<Vec<String>> = one
            .iter()
            .map(|branch| {
                let mut e = Vec::new();
                check(branch, value, path, depth + 1, &mut e);
                e
            })
            .collect();
        let matching = results.iter().filter(|e| e.is_empty()).count();
        if matching != 1 {
            let why: Vec<String> = results
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.is_empty())
                .map(|(i, e)| format!("branch {i}: {}", e.join("; ")))
                .collect();
            errs.push(format!(
                "{path}: {} matches {matching} of the {} oneOf branches, not exactly one ({})",
                describe(value),
                one.len(),
                why.join(" | ")
            ));
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        errs.push(format!(
            "{path}: {} is not one of the enum values {}",
            describe(value),
            Value::from(allowed.clone())
        ));
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        if !type_matches(t, value) {
            errs.push(format!("{path}: expected {t}, found {}", describe(value)));
            return;
        }
        if let Some(f) = s.get("format").and_then(Value::as_str) {
            check_format(t, f, value, path, errs);
        }
    }
    match value {
        Value::Object(o) => check_object(s, o, path, depth, errs),
        Value::Array(a) => {
            if let Some(items) = s.get("items") {
                for (i, v) in a.iter().enumerate() {
                    check(items, v, &idx(path, i), depth + 1, errs);
                }
            }
        }
        _ => {}
    }
}

/// The `format` of an integer or a string.
fn check_format(t: &str, f: &str, value: &Value, path: &str, errs: &mut Vec<String>) {
    match (t, f) {
        ("integer", "int64") if !value.is_i64() => errs.push(format!(
            "{path}: {} does not fit int64 (an integer from -2^63 to 2^63-1, without fraction or exponent)",
            describe(value)
        )),
        ("integer", "int32")
            if value
                .as_i64()
                .is_none_or(|n| i32::try_from(n).is_err()) =>
        {
            errs.push(format!("{path}: {} does not fit int32", describe(value)))
        }
        ("string", "date-time") => {
            if let Some(s) = value.as_str()
                && let Err(why) = check_rfc3339(s)
            {
                errs.push(format!(
                    "{path}: {s:?} is not an RFC 3339 date-time: {why}"
                ));
            }
        }
        _ => {}
    }
}

/// `properties`, `required` and `additionalProperties` of an object.
fn check_object(
    s: &Map<String, Value>,
    o: &Map<String, Value>,
    path: &str,
    depth: usize,
    errs: &mut Vec<String>,
) {
    let props = s.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for r in &required {
        match o.get(*r) {
            None => errs.push(format!("{}: required property is missing", key(path, r))),
            Some(Value::Null) => errs.push(format!("{}: required property is null", key(path, r))),
            Some(_) => {}
        }
    }
    let additional = s.get("additionalProperties");
    for (k, v) in o {
        let p = key(path, k);
        if let Some(ps) = props.and_then(|props| props.get(k)) {
            // An optional null is an absent field; a required null is reported above.
            if !v.is_null() {
                check(ps, v, &p, depth + 1, errs);
            }
        } else if let Some(a) = additional {
            check(a, v, &p, depth + 1, errs);
        } else if let Some(props) = props {
            let known: Vec<&str> = props.keys().map(String::as_str).collect();
            errs.push(format!(
                "{p}: unknown field {k:?} (known: {}); strict field validation rejects it",
                known.join(", ")
            ));
        }
    }
}

/// RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`.
fn check_rfc3339(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
            .then(|| s.get(r).and_then(|d| d.parse::<u32>().ok()))
            .flatten()
    };
    let (Some(_), Some(mo), Some(d), Some(h), Some(mi), Some(sec)) = (
        digits(0..4),
        digits(5..7),
        digits(8..10),
        digits(11..13),
        digits(14..16),
        digits(17..19),
    ) else {
        return Err("not YYYY-MM-DDTHH:MM:SS".into());
    };
    if b.get(4) != Some(&b'-')
        || b.get(7) != Some(&b'-')
        || !matches!(b.get(10), Some(b'T' | b't'))
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
    {
        return Err("not YYYY-MM-DDTHH:MM:SS".into());
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return Err("a field is out of range".into());
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return Err("a '.' without fraction digits".into());
        }
        rest = &frac[n..];
    }
    match rest.as_bytes() {
        [b'Z' | b'z'] => Ok(()),
        [b'+' | b'-', h1, h2, b':', m1, m2]
            if [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()) =>
        {
            Ok(())
        }
        _ => Err("no time zone (Z or ±HH:MM)".into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------

/// A DNS label as Kubernetes means it (RFC 1123 label): 1 to 63 characters of `a-z`, `0-9` and `-`,
/// starting and ending with a letter or digit.
pub fn check_dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".into());
    }
    if s.len() > 63 {
        return Err(format!("it has {} characters, more than 63", s.len()));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("it has a character other than a-z, 0-9 and -".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err("it does not start and end with a letter or digit".into());
    }
    Ok(())
}

/// A DNS subdomain as Kubernetes means it (RFC 1123 subdomain): at most 253 characters, one or more
/// parts separated by `.`, each of `a-z`, `0-9` and `-` and starting and ending with a letter or
/// digit.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".into());
    }
    if s.len() > 253 {
        return Err(format!("it has {} characters, more than 253", s.len()));
    }
    for part in s.split('.') {
        if part.is_empty() {
            return Err("it has an empty part between dots".into());
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("it has a character other than a-z, 0-9, - and .".into());
        }
        if part.starts_with('-') || part.ends_with('-') {
            return Err(format!(
                "its part {part:?} does not start and end with a letter or digit"
            ));
        }
    }
    Ok(())
}

/// A C identifier of at most `max` characters: a letter or `_`, then letters, digits and `_`.
pub fn check_c_identifier(s: &str, max: usize) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err("the identifier is empty".into()),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(format!(
                "the identifier {s:?} does not start with a letter or _"
            ));
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "the identifier {s:?} has a character other than letters, digits and _"
        ));
    }
    if s.len() > max {
        return Err(format!(
            "the identifier {s:?} has {} characters, more than {max}",
            s.len()
        ));
    }
    Ok(())
}

/// The name of a device attribute or capacity (Kubernetes' `QualifiedName`): a C identifier of at
/// most 32 characters, or a DNS subdomain of at most 63 characters, `/` and such an identifier.
///
/// The OpenAPI descriptions of the commit in `SOURCE.md` say of these map keys only that each "must
/// be unique in that set"; the format is the doc comment of the key type, `QualifiedName`, in
/// `staging/src/k8s.io/api/resource/v1/types.go` of kubernetes/kubernetes: "Names must be either a C
/// identifier (e.g. "theName") or a DNS subdomain followed by a slash ("/") followed by a C
/// identifier (e.g. "dra.example.com/theName")." and "The maximum length for the DNS subdomain is 63
/// characters (same as for driver names) and the maximum length of the C identifier is 32."
pub fn check_qualified_name(s: &str) -> Result<(), String> {
    match s.split_once('/') {
        None => check_c_identifier(s, 32),
        Some((domain, id)) => {
            check_dns_subdomain(domain).map_err(|e| format!("the domain {domain:?}: {e}"))?;
            if domain.len() > 63 {
                return Err(format!(
                    "the domain {domain:?} has {} characters, more than 63",
                    domain.len()
                ));
            }
            check_c_identifier(id, 32)
        }
    }
}

/// The name part of a label name: 1 to 63 characters of letters, digits, `-`, `_` and `.`, starting
/// and ending with a letter or digit.
fn check_label_name_part(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("the name part is empty".into());
    }
    if s.len() > 63 {
        return Err(format!(
            "the name part has {} characters, more than 63",
            s.len()
        ));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("it has a character other than letters, digits, -, _ and .".into());
    }
    let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !edge_ok(s.bytes().next()) || !edge_ok(s.bytes().last()) {
        return Err("it does not start and end with a letter or digit".into());
    }
    Ok(())
}

/// A label name (the form of a label key): an optional DNS subdomain prefix and `/`, then a name
/// part of at most 63 characters.
pub fn check_label_name(s: &str) -> Result<(), String> {
    match s.split_once('/') {
        None => check_label_name_part(s),
        Some((prefix, name)) => {
            check_dns_subdomain(prefix).map_err(|e| format!("the prefix {prefix:?}: {e}"))?;
            check_label_name_part(name)
        }
    }
}

/// A label value: empty, or a name part of at most 63 characters.
pub fn check_label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        Ok(())
    } else {
        check_label_name_part(s)
    }
}

/// A semantic version after semver.org 2.0.0: `MAJOR.MINOR.PATCH`, numbers without leading zeros,
/// then optionally `-` and dot-separated pre-release identifiers (numeric ones without leading
/// zeros) and `+` and dot-separated build identifiers, identifiers of `0-9A-Za-z-`.
pub fn check_semver(s: &str) -> Result<(), String> {
    let ident_ok =
        |i: &str| !i.is_empty() && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let numeric = |i: &str| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit());
    let no_leading_zero = |i: &str| i == "0" || !i.starts_with('0');
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 || !parts.iter().all(|p| numeric(p) && no_leading_zero(p)) {
        return Err(
            "it does not start with MAJOR.MINOR.PATCH (numbers without leading zeros)".into(),
        );
    }
    if let Some(pre) = pre {
        for i in pre.split('.') {
            if !ident_ok(i) || (numeric(i) && !no_leading_zero(i)) {
                return Err(format!("its pre-release identifier {i:?} is not valid"));
            }
        }
    }
    if let Some(build) = build
        && !build.split('.').all(ident_ok)
    {
        return Err(format!("its build metadata {build:?} is not valid"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Quantities
// ---------------------------------------------------------------------------------------------

/// The largest quantity in thousandths: "no quantity may represent a number greater than 2^63-1 in
/// magnitude" (the Quantity description).
pub const QUANTITY_MAX_MILLI: i128 = (i64::MAX as i128) * 1000;

/// Parses a quantity in the grammar the Quantity description states — an optional sign `+`/`-`, a
/// number (`1`, `1.5`, `1.`, `.5`), then nothing, a binary suffix (`Ki Mi Gi Ti Pi Ei`), a decimal
/// suffix (`m k M G T P E`) or a decimal exponent (`e`/`E`, an optional sign and digits) — and returns
/// its value in thousandths. As the description says, a larger number is capped (at 2^63-1) and a
/// more precise one rounded up (to whole thousandths, away from zero: `0.1m` is `1m`).
pub fn parse_quantity(s: &str) -> Result<i128, String> {
    let bad = |why: &str| Err(format!("{s:?} is not a quantity: {why}"));
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let int_len = body.bytes().take_while(u8::is_ascii_digit).count();
    let int_part = &body[..int_len];
    let mut rest = &body[int_len..];
    let mut frac_part = "";
    if let Some(after) = rest.strip_prefix('.') {
        let n = after.bytes().take_while(u8::is_ascii_digit).count();
        frac_part = &after[..n];
        rest = &after[n..];
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return bad("no digits");
    }
    // The suffix as a power of ten and a power of 1024.
    let (exp10, pow1024): (i64, u32) = match rest {
        "" => (0, 0),
        "Ki" => (0, 1),
        "Mi" => (0, 2),
        "Gi" => (0, 3),
        "Ti" => (0, 4),
        "Pi" => (0, 5),
        "Ei" => (0, 6),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        _ => {
            let Some(exp) = rest.strip_prefix(['e', 'E']) else {
                return bad("an unknown suffix");
            };
            let (neg, digits) = match exp.as_bytes().first() {
                Some(b'-') => (true, &exp[1..]),
                Some(b'+') => (false, &exp[1..]),
                _ => (false, exp),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return bad("an exponent without digits");
            }
            // Beyond ±1000 every value is capped or rounded the same way.
            let significant = digits.trim_start_matches('0');
            let n: i64 = if significant.len() > 4 {
                1000
            } else {
                significant.parse::<i64>().unwrap_or(0).min(1000)
            };
            (if neg { -n } else { n }, 0)
        }
    };
    let all_digits = format!("{int_part}{frac_part}");
    let mantissa = all_digits.trim_start_matches('0');
    if mantissa.is_empty() {
        return Ok(0);
    }
    let scale = exp10 + 3 - frac_part.len() as i64;
    let magnitude = if scale < 0 {
        let drop = usize::try_from(-scale).unwrap_or(usize::MAX);
        let keep = mantissa.len().saturating_sub(drop);
        let dropped_nonzero = mantissa[keep..].bytes().any(|b| b != b'0');
        let kept: i128 = if keep == 0 {
            0
        } else if keep > 30 {
            QUANTITY_MAX_MILLI
        } else {
            mantissa[..keep].parse().unwrap_or(QUANTITY_MAX_MILLI)
        };
        kept.saturating_add(i128::from(dropped_nonzero))
            .saturating_mul(1024_i128.pow(pow1024))
    } else if mantissa.len() as i64 + scale > 30 {
        QUANTITY_MAX_MILLI
    } else {
        let m: i128 = mantissa.parse().unwrap_or(QUANTITY_MAX_MILLI);
        m.saturating_mul(10_i128.pow(u32::try_from(scale).unwrap_or(0)))
            .saturating_mul(1024_i128.pow(pow1024))
    };
    let capped = magnitude.min(QUANTITY_MAX_MILLI);
    Ok(if negative { -capped } else { capped })
}

/// The value of a Quantity in JSON (a string, or a number, which Kubernetes parses from its text),
/// in thousandths.
pub fn quantity_value(v: &Value) -> Result<i128, String> {
    match v {
        Value::String(s) => parse_quantity(s),
        Value::Number(n) => parse_quantity(&n.to_string()),
        other => Err(format!(
            "{} is not a quantity (a string or a number)",
            describe(other)
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The rules of one ResourceSlice
// ---------------------------------------------------------------------------------------------

/// "Must not have more than 128 entries." (`ResourceSliceSpec.devices`)
pub const MAX_DEVICES: usize = 128;
/// "If any device uses taints or consumes counters the limit is 64." (`ResourceSliceSpec.devices`)
pub const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// "The maximum number of attributes and capacities combined is 32." (`Device.attributes`,
/// `Device.capacity`)
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// "Must not be longer than 64 characters." (`DeviceAttribute.string`, `DeviceAttribute.version`)
pub const MAX_ATTRIBUTE_STRING: usize = 64;
/// "The maximum number of counter sets is 8." (`ResourceSliceSpec.sharedCounters`)
pub const MAX_COUNTER_SETS: usize = 8;
/// "The maximum number of counters is 32." (`CounterSet.counters`)
pub const MAX_COUNTERS_PER_SET: usize = 32;
/// "The maximum number of device counter consumptions per device is 2." (`Device.consumesCounters`)
pub const MAX_COUNTER_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// "The maximum number of counters is 32." (`DeviceCounterConsumption.counters`)
pub const MAX_COUNTERS_PER_CONSUMPTION: usize = 32;
/// "The maximum number of taints is 16." (`Device.taints`)
pub const MAX_TAINTS: usize = 16;
/// "Valid effects are None, NoSchedule and NoExecute." (`DeviceTaint.effect`)
pub const TAINT_EFFECTS: [&str; 3] = ["None", "NoSchedule", "NoExecute"];
/// "The maximum number of binding conditions is 4." and "The maximum number of binding failure
/// conditions is 4." (`Device.bindingConditions`, `Device.bindingFailureConditions`)
pub const MAX_BINDING_CONDITIONS: usize = 4;
/// "Must not contain more than 10 entries." (`CapacityRequestPolicy.validValues`)
pub const MAX_VALID_VALUES: usize = 10;
/// The longest driver name: "The maximum length for the DNS subdomain is 63 characters (same as
/// for driver names)" (the `QualifiedName` doc comment, see [`check_qualified_name`]).
pub const MAX_DRIVER_NAME: usize = 63;

/// The array at `k` of `v`, empty when absent, null or not an array.
fn list<'a>(v: &'a Value, k: &str) -> &'a [Value] {
    v.get(k)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The object at `k` of `v`, if it is one.
fn map<'a>(v: &'a Value, k: &str) -> Option<&'a Map<String, Value>> {
    v.get(k).and_then(Value::as_object)
}

/// Whether the field `k` of `v` is set in the sense of the exactly-one-of rules: a non-empty string,
/// `true`, or (any other type) not null.
fn is_set(v: &Value, k: &str) -> bool {
    match v.get(k) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// Every violation by one ResourceSlice of the rules the schema descriptions (of the commit in
/// `SOURCE.md`) state in words; the schema itself is [`validate`]'s. Rules about a pool as a whole
/// are [`pool_rules`]'s. A field of the wrong type is skipped here (it is [`validate`]'s error).
///
/// The descriptions' sentences are quoted on the checks below. Not checked: "should end with a DNS
/// domain owned by the vendor" (not decidable), "The conditions must be a valid condition type
/// string" (the descriptions define no such format), and "Max (if set) and requestPolicy.default must
/// be a multiple of Step" (the range's own description makes the valid amounts Min + n·Step, and the
/// two readings differ when Min is not a multiple of Step). The Device description's "Besides the
/// name, exactly one field must be set." dates from `v1beta1`, where a Device held its fields in
/// `basic`; a `v1` Device sets attributes, capacity and more side by side, so it is not a rule here.
pub fn resource_slice_rules(slice: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(spec) = slice.get("spec").filter(|s| s.is_object()) else {
        errs.push("$.spec: missing or not an object; no rule can be checked".into());
        return errs;
    };
    let driver = spec.get("driver").and_then(Value::as_str).unwrap_or("");
    check_driver(spec, &mut errs);
    check_pool(spec, &mut errs);
    check_slice_node_selection(spec, &mut errs);

    let devices = list(spec, "devices");
    let shared = list(spec, "sharedCounters");
    check_devices_or_counters(devices, shared, &mut errs);
    check_device_count(devices, &mut errs);
    check_shared_counters(shared, &mut errs);

    let per_device = spec.get("perDeviceNodeSelection") == Some(&Value::Bool(true));
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, device) in devices.iter().enumerate() {
        let path = idx("$.spec.devices", i);
        if let Some(name) = device.get("name").and_then(Value::as_str) {
            check_device_name(name, &path, &mut errs);
            // "Each device in a given pool, regardless of how many ResourceSlices, must have a
            // unique name." (ResourceSlice); within this slice here, across slices in pool_rules.
            if let Some(first) = names.insert(name, i) {
                errs.push(format!(
                    "{path}.name: device name {name:?} is also $.spec.devices[{first}].name; each device in a pool must have a unique name"
                ));
            }
        }
        check_device(device, driver, per_device, &path, &mut errs);
    }
    errs
}

/// "Must be a DNS subdomain and should end with a DNS domain owned by the vendor of the driver. It
/// should use only lower case characters." (`ResourceSliceSpec.driver`), at most
/// [`MAX_DRIVER_NAME`] characters.
fn check_driver(spec: &Value, errs: &mut Vec<String>) {
    let Some(driver) = spec.get("driver").and_then(Value::as_str) else {
        return;
    };
    if let Err(why) = check_dns_subdomain(driver) {
        errs.push(format!(
            "$.spec.driver: {driver:?} is not a DNS subdomain: {why}"
        ));
    } else if driver.len() > MAX_DRIVER_NAME {
        errs.push(format!(
            "$.spec.driver: {driver:?} has {} characters, more than the {MAX_DRIVER_NAME} of a driver name",
            driver.len()
        ));
    }
}

/// The pool: "It must not be longer than 253 characters and must consist of one or more DNS
/// sub-domains separated by slashes." (`ResourcePool.name`) and, of `resourceSliceCount`, "Must be
/// greater than zero."
fn check_pool(spec: &Value, errs: &mut Vec<String>) {
    let Some(pool) = spec.get("pool") else {
        return;
    };
    if let Some(name) = pool.get("name").and_then(Value::as_str)
        && let Err(why) = check_pool_name(name)
    {
        errs.push(format!(
            "$.spec.pool.name: {name:?} is not a pool name (at most 253 characters, DNS subdomains separated by slashes): {why}"
        ));
    }
    if let Some(n) = pool.get("resourceSliceCount").and_then(Value::as_i64)
        && n <= 0
    {
        errs.push(format!(
            "$.spec.pool.resourceSliceCount: {n}; it must be greater than zero"
        ));
    }
}

/// A pool name: at most 253 characters, one or more DNS subdomains separated by `/`.
pub fn check_pool_name(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err(format!("it has {} characters, more than 253", s.len()));
    }
    for part in s.split('/') {
        check_dns_subdomain(part).map_err(|e| format!("the part {part:?}: {e}"))?;
    }
    Ok(())
}

/// "Exactly one of NodeName, NodeSelector, AllNodes, and PerDeviceNodeSelection must be set."
/// (`ResourceSliceSpec`), "set" being a non-empty `nodeName`, a `nodeSelector`, `allNodes: true` or
/// `perDeviceNodeSelection: true`; and of `nodeSelector`, "Must use exactly one term."
fn check_slice_node_selection(spec: &Value, errs: &mut Vec<String>) {
    let fields = [
        "nodeName",
        "nodeSelector",
        "allNodes",
        "perDeviceNodeSelection",
    ];
    let set: Vec<&str> = fields.into_iter().filter(|k| is_set(spec, k)).collect();
    if set.len() != 1 {
        errs.push(format!(
            "$.spec: {} of nodeName, nodeSelector, allNodes, perDeviceNodeSelection set ({}); exactly one of them must be set",
            set.len(),
            set.join(", ")
        ));
    }
    if let Some(selector) = spec.get("nodeSelector") {
        check_one_term(selector, "$.spec.nodeSelector", errs);
    }
}

/// "Must use exactly one term." (`nodeSelector` of a ResourceSliceSpec and of a Device)
fn check_one_term(selector: &Value, path: &str, errs: &mut Vec<String>) {
    if let Some(terms) = selector.get("nodeSelectorTerms").and_then(Value::as_array)
        && terms.len() != 1
    {
        errs.push(format!(
            "{path}.nodeSelectorTerms: {} terms; a node selector here must use exactly one term",
            terms.len()
        ));
    }
}

/// "Only one of Devices and SharedCounters can be set in a ResourceSlice." (`ResourceSliceSpec.devices`
/// and `ResourceSliceSpec.sharedCounters`): the KEP-4815 (partitionable devices) layout of
/// Kubernetes 1.35, where counter sets and the devices consuming them are published in different
/// slices of one pool. "Set" is a non-empty list.
fn check_devices_or_counters(devices: &[Value], shared: &[Value], errs: &mut Vec<String>) {
    if !devices.is_empty() && !shared.is_empty() {
        errs.push(format!(
            "$.spec: sets both devices ({}) and sharedCounters ({}); only one of devices and sharedCounters can be set in a ResourceSlice",
            devices.len(),
            shared.len()
        ));
    }
}

/// "Must not have more than 128 entries. If any device uses taints or consumes counters the limit
/// is 64." (`ResourceSliceSpec.devices`), and of `Device.taints`, "If taints are set for any device
/// in a ResourceSlice, then the maximum number of allowed devices per ResourceSlice is 64 instead of
/// 128."
fn check_device_count(devices: &[Value], errs: &mut Vec<String>) {
    let advanced = devices
        .iter()
        .any(|d| !list(d, "taints").is_empty() || !list(d, "consumesCounters").is_empty());
    let max = if advanced {
        MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
    } else {
        MAX_DEVICES
    };
    if devices.len() > max {
        let why = if advanced {
            "a device uses taints or consumes counters, so the limit is 64"
        } else {
            "the limit is 128"
        };
        errs.push(format!(
            "$.spec.devices: {} devices, more than {max} ({why})",
            devices.len()
        ));
    }
}

/// The counter sets: "The names of the counter sets must be unique in the ResourcePool." (checked
/// here within the slice; across the pool in [`pool_rules`]), "The maximum number of counter sets
/// is 8." (`ResourceSliceSpec.sharedCounters`); "Name defines the name of the counter set. It must be
/// a DNS label." (`CounterSet.name`); "The name of each counter must be unique in that set and must
/// be a DNS label." and "The maximum number of counters is 32." (`CounterSet.counters`); each
/// counter's value a quantity.
fn check_shared_counters(shared: &[Value], errs: &mut Vec<String>) {
    if shared.len() > MAX_COUNTER_SETS {
        errs.push(format!(
            "$.spec.sharedCounters: {} counter sets, more than {MAX_COUNTER_SETS}",
            shared.len()
        ));
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, set) in shared.iter().enumerate() {
        let path = idx("$.spec.sharedCounters", i);
        if let Some(name) = set.get("name").and_then(Value::as_str) {
            if let Err(why) = check_dns_label(name) {
                errs.push(format!(
                    "{path}.name: counter set name {name:?} is not a DNS label: {why}"
                ));
            }
            if let Some(first) = names.insert(name, i) {
                errs.push(format!(
                    "{path}.name: counter set name {name:?} is also $.spec.sharedCounters[{first}].name; counter set names must be unique in the pool"
                ));
            }
        }
        if let Some(counters) = map(set, "counters") {
            let cpath = format!("{path}.counters");
            if counters.len() > MAX_COUNTERS_PER_SET {
                errs.push(format!(
                    "{cpath}: {} counters, more than {MAX_COUNTERS_PER_SET}",
                    counters.len()
                ));
            }
            for (name, counter) in counters {
                let p = key(&cpath, name);
                if let Err(why) = check_dns_label(name) {
                    errs.push(format!(
                        "{p}: counter name {name:?} is not a DNS label: {why}"
                    ));
                }
                check_quantity_at(counter.get("value"), &format!("{p}.value"), errs);
            }
        }
    }
}

/// "Name is unique identifier among all devices managed by the driver in the pool. It must be a DNS
/// label." (`Device.name`)
fn check_device_name(name: &str, path: &str, errs: &mut Vec<String>) {
    if let Err(why) = check_dns_label(name) {
        errs.push(format!(
            "{path}.name: device name {name:?} is not a DNS label: {why}"
        ));
    }
}

/// A quantity at `path`, if there is one there.
fn check_quantity_at(v: Option<&Value>, path: &str, errs: &mut Vec<String>) -> Option<i128> {
    match v {
        None | Some(Value::Null) => None,
        Some(v) => match quantity_value(v) {
            Ok(q) => Some(q),
            Err(why) => {
                errs.push(format!("{path}: {why}"));
                None
            }
        },
    }
}

/// The rules of one device.
fn check_device(
    device: &Value,
    driver: &str,
    per_device: bool,
    path: &str,
    errs: &mut Vec<String>,
) {
    let attributes = map(device, "attributes");
    let capacity = map(device, "capacity");
    // "The maximum number of attributes and capacities combined is 32." (Device.attributes,
    // Device.capacity)
    let n = attributes.map_or(0, Map::len) + capacity.map_or(0, Map::len);
    if n > MAX_ATTRIBUTES_AND_CAPACITIES {
        errs.push(format!(
            "{path}: {n} attributes and capacities, more than the {MAX_ATTRIBUTES_AND_CAPACITIES} a device may have combined"
        ));
    }
    if let Some(attributes) = attributes {
        check_names(
            attributes,
            driver,
            &format!("{path}.attributes"),
            "attribute",
            errs,
        );
        for (name, attr) in attributes {
            check_attribute(attr, &key(&format!("{path}.attributes"), name), errs);
        }
    }
    let multiple = device.get("allowMultipleAllocations") == Some(&Value::Bool(true));
    if let Some(capacity) = capacity {
        check_names(
            capacity,
            driver,
            &format!("{path}.capacity"),
            "capacity",
            errs,
        );
        for (name, cap) in capacity {
            check_capacity(cap, multiple, &key(&format!("{path}.capacity"), name), errs);
        }
    }
    check_consumes_counters(device, path, errs);
    check_device_node_selection(device, per_device, path, errs);
    check_taints(device, path, errs);
    for (field, what) in [
        ("bindingConditions", "binding conditions"),
        ("bindingFailureConditions", "binding failure conditions"),
    ] {
        // "The maximum number of binding conditions is 4." / "The maximum number of binding
        // failure conditions is 4." (Device)
        let n = list(device, field).len();
        if n > MAX_BINDING_CONDITIONS {
            errs.push(format!(
                "{path}.{field}: {n} {what}, more than {MAX_BINDING_CONDITIONS}"
            ));
        }
    }
}

/// The names of a device's attributes or capacities: each a qualified name
/// ([`check_qualified_name`]), and "The name of each attribute must be unique in that set." /
/// "The name of each capacity must be unique in that set." (`Device.attributes`,
/// `Device.capacity`) — a name without a domain is in the driver's domain (the `QualifiedName` doc:
/// "Names which do not include the domain prefix are assumed to be part of the driver's domain."),
/// so `model` and `<driver>/model` are the same name.
fn check_names(
    entries: &Map<String, Value>,
    driver: &str,
    path: &str,
    what: &str,
    errs: &mut Vec<String>,
) {
    let mut full: BTreeMap<String, &str> = BTreeMap::new();
    for name in entries.keys() {
        if let Err(why) = check_qualified_name(name) {
            errs.push(format!(
                "{}: {what} name {name:?} is not a qualified name (a C identifier of at most 32 characters, optionally after a DNS subdomain of at most 63 and /): {why}",
                key(path, name)
            ));
        }
        let qualified = if name.contains('/') {
            name.clone()
        } else {
            format!("{driver}/{name}")
        };
        if let Some(other) = full.insert(qualified, name) {
            errs.push(format!(
                "{}: {what} name {name:?} is the same as {other:?} (a name without a domain is in the driver's domain); the name of each {what} must be unique",
                key(path, name)
            ));
        }
    }
}

/// "DeviceAttribute must have exactly one field set." (`DeviceAttribute`); "StringValue is a string.
/// Must not be longer than 64 characters." and "VersionValue is a semantic version according to
/// semver.org spec 2.0.0. Must not be longer than 64 characters."
fn check_attribute(attr: &Value, path: &str, errs: &mut Vec<String>) {
    let Some(o) = attr.as_object() else {
        return;
    };
    let set: Vec<&str> = ["bool", "int", "string", "version"]
        .into_iter()
        .filter(|k| o.get(*k).is_some_and(|v| !v.is_null()))
        .collect();
    if set.len() != 1 {
        errs.push(format!(
            "{path}: {} of bool, int, string, version set ({}); a DeviceAttribute must have exactly one field set",
            set.len(),
            set.join(", ")
        ));
    }
    for field in ["string", "version"] {
        let Some(s) = o.get(field).and_then(Value::as_str) else {
            continue;
        };
        let n = s.chars().count();
        if n > MAX_ATTRIBUTE_STRING {
            errs.push(format!(
                "{path}.{field}: {n} characters, longer than {MAX_ATTRIBUTE_STRING}"
            ));
        }
        if field == "version"
            && let Err(why) = check_semver(s)
        {
            errs.push(format!(
                "{path}.version: {s:?} is not a semantic version (semver.org 2.0.0): {why}"
            ));
        }
    }
}

/// A capacity: its value and request policy quantities, and the policy's rules: "The Device must
/// have allowMultipleAllocations set to true in order to set a requestPolicy."
/// (`DeviceCapacity.requestPolicy`); "Must not set more than one ValidRequestValues."
/// (`CapacityRequestPolicy`: `validValues` or `validRange`); of `validValues`, "Must not contain
/// more than 10 entries. Must be sorted in ascending order." and "If this field is set, Default must
/// be defined and it must be included in ValidValues list."; of `validRange`, "If this field is set,
/// Default must be defined and it must fall within the defined ValidRange."; of the range, "Min must
/// be greater than or equal to zero, and less than or equal to the capacity value.", "Max must be
/// less than or equal to the capacity value. Min and requestPolicy.default must be less than or
/// equal to the maximum.", "requestPolicy.default must be more than or equal to the minimum." and
/// "Min + Step must be less than or equal to the capacity value."
fn check_capacity(cap: &Value, multiple: bool, path: &str, errs: &mut Vec<String>) {
    let value = check_quantity_at(cap.get("value"), &format!("{path}.value"), errs);
    let Some(policy) = cap.get("requestPolicy").filter(|p| p.is_object()) else {
        return;
    };
    let ppath = format!("{path}.requestPolicy");
    if !multiple {
        errs.push(format!(
            "{ppath}: set on a device without allowMultipleAllocations: true; the device must allow multiple allocations to set a requestPolicy"
        ));
    }
    let default = check_quantity_at(policy.get("default"), &format!("{ppath}.default"), errs);
    let has_default = policy.get("default").is_some_and(|d| !d.is_null());
    let values = list(policy, "validValues");
    let range = policy.get("validRange").filter(|r| r.is_object());
    if !values.is_empty() && range.is_some() {
        errs.push(format!(
            "{ppath}: sets both validValues and validRange; a request policy must not set more than one"
        ));
    }
    if !values.is_empty() {
        let vpath = format!("{ppath}.validValues");
        if values.len() > MAX_VALID_VALUES {
            errs.push(format!(
                "{vpath}: {} entries, more than {MAX_VALID_VALUES}",
                values.len()
            ));
        }
        let parsed: Vec<Option<i128>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| check_quantity_at(Some(v), &idx(&vpath, i), errs))
            .collect();
        let known: Vec<i128> = parsed.iter().flatten().copied().collect();
        if known.windows(2).any(|w| w[0] > w[1]) {
            errs.push(format!("{vpath}: not sorted in ascending order"));
        }
        if !has_default {
            errs.push(format!(
                "{ppath}.default: missing; with validValues set, default must be defined"
            ));
        } else if let Some(d) = default
            && parsed.iter().all(Option::is_some)
            && !known.contains(&d)
        {
            errs.push(format!(
                "{ppath}.default: not one of validValues; it must be included in the list"
            ));
        }
    }
    if let Some(range) = range {
        let rpath = format!("{ppath}.validRange");
        let min = check_quantity_at(range.get("min"), &format!("{rpath}.min"), errs);
        let max = check_quantity_at(range.get("max"), &format!("{rpath}.max"), errs);
        let step = check_quantity_at(range.get("step"), &format!("{rpath}.step"), errs);
        if !has_default {
            errs.push(format!(
                "{ppath}.default: missing; with validRange set, default must be defined"
            ));
        }
        if let Some(min) = min {
            if min < 0 {
                errs.push(format!("{rpath}.min: less than zero"));
            }
            if value.is_some_and(|v| min > v) {
                errs.push(format!("{rpath}.min: more than the capacity value"));
            }
            if default.is_some_and(|d| d < min) {
                errs.push(format!(
                    "{ppath}.default: less than validRange.min; it must fall within the range"
                ));
            }
            if let (Some(step), Some(v)) = (step, value)
                && min.saturating_add(step) > v
            {
                errs.push(format!(
                    "{rpath}.step: min + step is more than the capacity value"
                ));
            }
        }
        if let Some(max) = max {
            if value.is_some_and(|v| max > v) {
                errs.push(format!("{rpath}.max: more than the capacity value"));
            }
            if min.is_some_and(|m| m > max) {
                errs.push(format!("{rpath}.min: more than validRange.max"));
            }
            if default.is_some_and(|d| d > max) {
                errs.push(format!(
                    "{ppath}.default: more than validRange.max; it must fall within the range"
                ));
            }
        }
    }
}

/// "There can only be a single entry per counterSet." and "The maximum number of device counter
/// consumptions per device is 2." (`Device.consumesCounters`); "The maximum number of counters is
/// 32." (`DeviceCounterConsumption.counters`); each consumed value a quantity. Whether the named
/// counter sets and counters exist is [`pool_rules`]'s: they are in other slices of the pool.
fn check_consumes_counters(device: &Value, path: &str, errs: &mut Vec<String>) {
    let consumes = list(device, "consumesCounters");
    let cpath = format!("{path}.consumesCounters");
    if consumes.len() > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE {
        errs.push(format!(
            "{cpath}: {} entries, more than the {MAX_COUNTER_CONSUMPTIONS_PER_DEVICE} device counter consumptions a device may have",
            consumes.len()
        ));
    }
    let mut sets: HashMap<&str, usize> = HashMap::new();
    for (j, c) in consumes.iter().enumerate() {
        let p = idx(&cpath, j);
        if let Some(set) = c.get("counterSet").and_then(Value::as_str)
            && let Some(first) = sets.insert(set, j)
        {
            errs.push(format!(
                "{p}.counterSet: counter set {set:?} is also {}; there can only be a single entry per counterSet",
                idx(&cpath, first)
            ));
        }
        if let Some(counters) = map(c, "counters") {
            if counters.len() > MAX_COUNTERS_PER_CONSUMPTION {
                errs.push(format!(
                    "{p}.counters: {} counters, more than {MAX_COUNTERS_PER_CONSUMPTION}",
                    counters.len()
                ));
            }
            for (name, counter) in counters {
                let q = key(&format!("{p}.counters"), name);
                check_quantity_at(counter.get("value"), &format!("{q}.value"), errs);
            }
        }
    }
}

/// A device's own node selection: "Must only be set if Spec.PerDeviceNodeSelection is set to true.
/// At most one of NodeName, NodeSelector and AllNodes can be set." (`Device.nodeName`,
/// `Device.nodeSelector`, `Device.allNodes`); "If it is set to true, every device defined the
/// ResourceSlice must specify this individually." (`ResourceSliceSpec.perDeviceNodeSelection`); and
/// of `Device.nodeSelector`, "Must use exactly one term."
fn check_device_node_selection(
    device: &Value,
    per_device: bool,
    path: &str,
    errs: &mut Vec<String>,
) {
    let set: Vec<&str> = ["nodeName", "nodeSelector", "allNodes"]
        .into_iter()
        .filter(|k| is_set(device, k))
        .collect();
    if per_device && set.len() != 1 {
        errs.push(format!(
            "{path}: {} of nodeName, nodeSelector, allNodes set ({}); with spec.perDeviceNodeSelection every device must set exactly one",
            set.len(),
            set.join(", ")
        ));
    }
    if !per_device && !set.is_empty() {
        errs.push(format!(
            "{path}: sets {}, which a device may set only if spec.perDeviceNodeSelection is true",
            set.join(", ")
        ));
    }
    if let Some(selector) = device.get("nodeSelector") {
        check_one_term(selector, &format!("{path}.nodeSelector"), errs);
    }
}

/// "The maximum number of taints is 16." (`Device.taints`); "Valid effects are None, NoSchedule and
/// NoExecute." (`DeviceTaint.effect`); "The taint key to be applied to a device. Must be a label
/// name." and "The taint value corresponding to the taint key. Must be a label value."
fn check_taints(device: &Value, path: &str, errs: &mut Vec<String>) {
    let taints = list(device, "taints");
    let tpath = format!("{path}.taints");
    if taints.len() > MAX_TAINTS {
        errs.push(format!(
            "{tpath}: {} taints, more than {MAX_TAINTS}",
            taints.len()
        ));
    }
    for (k, taint) in taints.iter().enumerate() {
        let p = idx(&tpath, k);
        if let Some(effect) = taint.get("effect").and_then(Value::as_str)
            && !TAINT_EFFECTS.contains(&effect)
        {
            errs.push(format!(
                "{p}.effect: {effect:?} is not a valid effect ({})",
                TAINT_EFFECTS.join(", ")
            ));
        }
        if let Some(k) = taint.get("key").and_then(Value::as_str)
            && let Err(why) = check_label_name(k)
        {
            errs.push(format!("{p}.key: {k:?} is not a label name: {why}"));
        }
        if let Some(v) = taint.get("value").and_then(Value::as_str)
            && let Err(why) = check_label_value(v)
        {
            errs.push(format!("{p}.value: {v:?} is not a label value: {why}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The rules of a pool
// ---------------------------------------------------------------------------------------------

/// Every violation of the rules across the slices of each pool in `slices` (a pool: the slices with
/// the same `spec.driver` and `spec.pool.name`), taking `slices` as the whole of each pool at one
/// moment, as the driver publishes it once its update is done. Paths are `$[i]...`, `i` indexing
/// `slices`.
///
/// - "Whenever a driver changes something about one or more of the resources in a pool, it must
///   change the generation in all ResourceSlices which are part of that pool."
///   (`ResourcePool.generation`): one generation in all slices of the pool.
/// - "ResourceSliceCount is the total number of ResourceSlices in the pool at this generation
///   number." (`ResourcePool.resourceSliceCount`): the same count in every slice, equal to the
///   number of slices.
/// - "Each device in a given pool, regardless of how many ResourceSlices, must have a unique name."
///   (`ResourceSlice`).
/// - "The names of the counter sets must be unique in the ResourcePool."
///   (`ResourceSliceSpec.sharedCounters`).
/// - "ConsumesCounters defines a list of references to sharedCounters and the set of counters that
///   the device will consume from those counter sets." (`Device.consumesCounters`) and "CounterSet
///   is the name of the set from which the counters defined will be consumed."
///   (`DeviceCounterConsumption.counterSet`): each consumption names a counter set of the pool and
///   counters of that set, and each consumed value is a Counter whose value is a Quantity the
///   schema accepts and that parses.
///
/// What devices together could consume is not compared with what the counter sets hold: devices
/// compete for the counters at allocation, so the sum may well exceed them; only the references are
/// checked.
pub fn pool_rules(slices: &[Value]) -> Vec<String> {
    let mut errs = Vec::new();
    let mut pools: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, slice) in slices.iter().enumerate() {
        let spec = slice.get("spec");
        let driver = spec.and_then(|s| s.get("driver")).and_then(Value::as_str);
        let pool = spec
            .and_then(|s| s.get("pool"))
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str);
        match (driver, pool) {
            (Some(d), Some(p)) => pools.entry((d, p)).or_default().push(i),
            _ => errs.push(format!(
                "$[{i}]: no spec.driver or spec.pool.name string; the slice belongs to no pool"
            )),
        }
    }
    for ((driver, pool), members) in &pools {
        check_pool_members(slices, driver, pool, members, &mut errs);
    }
    errs
}

/// A pool's counter sets by name: where the first is defined, and its counters.
type CounterSets<'a> = HashMap<&'a str, (String, Option<&'a Map<String, Value>>)>;

/// The rules of one pool, whose slices are `slices[i]` for `i` in `members`.
fn check_pool_members(
    slices: &[Value],
    driver: &str,
    pool: &str,
    members: &[usize],
    errs: &mut Vec<String>,
) {
    let which = format!("pool {pool:?} of driver {driver:?}");
    let pool_field = |i: usize, k: &str| {
        slices
            .get(i)
            .and_then(|s| s.get("spec"))
            .and_then(|s| s.get("pool"))
            .and_then(|p| p.get(k))
            .and_then(Value::as_i64)
    };
    let generations: BTreeSet<Option<i64>> = members
        .iter()
        .map(|&i| pool_field(i, "generation"))
        .collect();
    if generations.len() > 1 {
        let each: Vec<String> = members
            .iter()
            .map(|&i| format!("$[{i}]: {:?}", pool_field(i, "generation")))
            .collect();
        errs.push(format!(
            "{which}: the slices have different spec.pool.generation ({}); a pool's slices all have one generation",
            each.join(", ")
        ));
    }
    for &i in members {
        match pool_field(i, "resourceSliceCount") {
            Some(n) if usize::try_from(n).ok() == Some(members.len()) => {}
            n => errs.push(format!(
                "$[{i}].spec.pool.resourceSliceCount: {n:?}, but {which} has {} slices; resourceSliceCount is the total number of ResourceSlices in the pool",
                members.len()
            )),
        }
    }

    // Device names and counter sets of the whole pool.
    let mut devices: HashMap<&str, String> = HashMap::new();
    let mut sets: CounterSets = HashMap::new();
    for &i in members {
        let Some(spec) = slices.get(i).and_then(|s| s.get("spec")) else {
            continue;
        };
        for (j, device) in list(spec, "devices").iter().enumerate() {
            let path = format!("$[{i}].spec.devices[{j}].name");
            if let Some(name) = device.get("name").and_then(Value::as_str) {
                if let Some(first) = devices.get(name) {
                    errs.push(format!(
                        "{path}: device name {name:?} is also {first}; each device in {which} must have a unique name"
                    ));
                } else {
                    devices.insert(name, path);
                }
            }
        }
        for (j, set) in list(spec, "sharedCounters").iter().enumerate() {
            let path = format!("$[{i}].spec.sharedCounters[{j}].name");
            if let Some(name) = set.get("name").and_then(Value::as_str) {
                if let Some((first, _)) = sets.get(name) {
                    errs.push(format!(
                        "{path}: counter set name {name:?} is also {first}; counter set names must be unique in {which}"
                    ));
                } else {
                    sets.insert(name, (path, map(set, "counters")));
                }
            }
        }
    }

    // The consumptions' references and values.
    for &i in members {
        let Some(spec) = slices.get(i).and_then(|s| s.get("spec")) else {
            continue;
        };
        for (j, device) in list(spec, "devices").iter().enumerate() {
            for (k, c) in list(device, "consumesCounters").iter().enumerate() {
                let p = format!("$[{i}].spec.devices[{j}].consumesCounters[{k}]");
                let Some(set_name) = c.get("counterSet").and_then(Value::as_str) else {
                    continue;
                };
                let set = sets.get(set_name);
                if set.is_none() {
                    errs.push(format!(
                        "{p}.counterSet: names counter set {set_name:?}, which no slice of {which} defines in sharedCounters"
                    ));
                }
                let Some(counters) = map(c, "counters") else {
                    continue;
                };
                for (name, counter) in counters {
                    let q = key(&format!("{p}.counters"), name);
                    if let Some((set_path, Some(defined))) = set
                        && !defined.contains_key(name)
                    {
                        errs.push(format!(
                            "{q}: counter {name:?} is not a counter of counter set {set_name:?} ({set_path})"
                        ));
                    }
                    errs.extend(validate_at(COUNTER, counter, &q));
                    if let Some(v) = counter.get("value").filter(|v| !v.is_null())
                        && let Err(why) = quantity_value(v)
                    {
                        errs.push(format!("{q}.value: {why}"));
                    }
                }
            }
        }
    }
}
