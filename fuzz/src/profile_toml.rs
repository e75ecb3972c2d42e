//! Profile files (`vgpu_manager::profile::Profile::from_toml`, what `/etc/vgpu-manager/profiles.d`
//! and `--profiles` hold). Beyond "no panic": a profile that validates keeps the documented bounds
//! (name, weight 1-100, heads ≤ 16, a resolution only with heads, `prefer` within `backends`), and
//! written back as a profile file it reads as the same profile.

use toml::{Table, Value};
use vgpu_manager::pool::Pool;
use vgpu_manager::profile::{Catalog, Profile};

const ORIGIN: &str = "fuzz.toml";

fn words<T: Copy>(list: &[T], word: impl Fn(T) -> &'static str) -> Value {
    Value::Array(list.iter().map(|x| Value::from(word(*x))).collect())
}

/// `p` as a profile file.
pub fn render(p: &Profile) -> String {
    let mut t = Table::new();
    t.insert("name".into(), p.name.clone().into());
    t.insert("description".into(), p.description.clone().into());
    t.insert("class".into(), p.class.as_str().into());
    t.insert(
        "framebuffer".into(),
        format!("{}M", p.framebuffer_mib).into(),
    );
    t.insert("heads".into(), i64::from(p.heads).into());
    if let Some(r) = p.max_resolution {
        t.insert("max_resolution".into(), r.to_string().into());
    }
    t.insert("weight".into(), i64::from(p.weight).into());
    if let Some(pr) = p.priority {
        t.insert("priority".into(), pr.as_str().into());
    }
    t.insert("vendors".into(), words(&p.vendors, |v| v.as_str()));
    t.insert("backends".into(), words(&p.backends, |b| b.as_str()));
    t.insert("device_api".into(), p.device_api.clone().into());
    t.insert("prefer".into(), words(&p.prefer, |b| b.as_str()));
    toml::to_string(&t).unwrap_or_else(|e| panic!("{p:?} cannot be written as TOML: {e}"))
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let p = match Profile::from_toml(ORIGIN, text) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert!(Pool::is_valid_name(&p.name), "{p:?}");
    assert!(!p.description.is_empty() && p.description.trim() == p.description);
    assert!((1..=100).contains(&p.weight) && p.heads <= 16, "{p:?}");
    assert!(p.max_resolution.is_none() || p.heads >= 1, "{p:?}");
    assert!(p.prefer.iter().all(|b| p.backends.contains(b)), "{p:?}");
    let shown = render(&p);
    match Profile::from_toml(ORIGIN, &shown) {
        Ok(again) => assert_eq!(again, p, "{shown}"),
        Err(e) => panic!("{p:?} written as\n{shown}\ndoes not read back: {e}"),
    }
    let catalog = Catalog::from_profiles(vec![p.clone()])
        .unwrap_or_else(|e| panic!("a catalog of {p:?} alone is refused: {e}"));
    assert_eq!(catalog.get(&p.name), Some(&p));
}
