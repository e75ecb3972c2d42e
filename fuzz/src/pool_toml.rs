//! Pool files (`vgpu_manager::pool::Pool::from_toml` against the builtin profile catalog, as
//! `vgpuctl pool`, `/etc/vgpu-manager/pools.d` and D-Bus `Plan`/`Apply` read them). Beyond "no
//! panic": a pool that validates keeps the documented bounds, the catalog-free reading
//! (`Pool::name_in`, what the store checks of an applied pool) agrees on its name, and written back as
//! a pool file it reads as the same pool.

use std::sync::OnceLock;

use toml::{Table, Value};
use vgpu_manager::daemon::store::codec;
use vgpu_manager::pool::Pool;
use vgpu_manager::pool::spec::MAX_SLOTS;
use vgpu_manager::profile::Catalog;

const ORIGIN: &str = "fuzz.toml";

fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| Catalog::builtin().expect("the builtin profiles load"))
}

fn strings<'a>(list: impl IntoIterator<Item = &'a str>) -> Value {
    Value::Array(list.into_iter().map(Value::from).collect())
}

/// `p` as a pool file.
pub fn render(p: &Pool) -> String {
    let mut t = Table::new();
    t.insert("name".into(), p.name.clone().into());
    t.insert("description".into(), p.description.clone().into());
    t.insert("policy".into(), p.policy.as_str().into());
    t.insert("autostart".into(), p.autostart.into());
    let profiles: Table = p
        .profiles
        .iter()
        .map(|(k, n)| (k.clone(), Value::from(i64::from(*n))))
        .collect();
    t.insert("profiles".into(), Value::Table(profiles));
    let s = &p.select;
    let mut select = Table::new();
    select.insert(
        "vendors".into(),
        strings(s.vendors.iter().map(|v| v.as_str())),
    );
    select.insert(
        "models".into(),
        strings(s.models.iter().map(String::as_str)),
    );
    select.insert("gpus".into(), strings(s.gpus.iter().map(String::as_str)));
    if let Some(n) = s.numa_node {
        select.insert("numa_node".into(), i64::from(n).into());
    }
    select.insert("strict_numa".into(), s.strict_numa.into());
    t.insert("select".into(), Value::Table(select));
    toml::to_string(&t).unwrap_or_else(|e| panic!("{p:?} cannot be written as TOML: {e}"))
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let named = Pool::name_in(ORIGIN, text);
    let p = match Pool::from_toml(ORIGIN, text, catalog()) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert_eq!(named.as_ref().ok(), Some(&p.name), "{p:?}");
    assert!(Pool::is_valid_name(&p.name), "{p:?}");
    assert!(!p.profiles.is_empty(), "{p:?}");
    for (profile, n) in &p.profiles {
        assert!(
            catalog().get(profile).is_some() && (1..=MAX_SLOTS).contains(n),
            "{p:?}"
        );
    }
    assert!(
        !p.select.strict_numa || p.select.numa_node.is_some(),
        "{p:?}"
    );
    let applied = codec::decode_applied_pool(text)
        .unwrap_or_else(|e| panic!("a valid pool is refused as an applied pool: {e}"));
    assert_eq!(applied.name, p.name);
    let shown = render(&p);
    match Pool::from_toml(ORIGIN, &shown, catalog()) {
        Ok(again) => assert_eq!(again, p, "{shown}"),
        Err(e) => panic!("{p:?} written as\n{shown}\ndoes not read back: {e}"),
    }
}
