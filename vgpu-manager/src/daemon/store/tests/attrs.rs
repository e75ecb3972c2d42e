//! The mdev attributes of a definition: kept in order, absent in older files, checked on load.

use super::*;
use crate::daemon::api::MdevAttr;

fn with_attrs(n: u32, attrs: &[(&str, &str)]) -> Definition {
    Definition {
        attrs: attrs
            .iter()
            .map(|(k, v)| MdevAttr::new(k, v).unwrap())
            .collect(),
        ..def(n)
    }
}

#[test]
fn attributes_survive_a_reopen_in_their_order() {
    let tmp = tempfile::tempdir().unwrap();
    let d = with_attrs(
        1,
        &[
            ("assign_adapter", "5"),
            ("assign_domain", "4"),
            ("assign_adapter", "6"),
        ],
    );
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&d).unwrap();
    }
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert!(report.set_aside.is_empty(), "{report:#?}");
    assert_eq!(defs_of(&s), vec![d]);
    let text = fs::read_to_string(
        tmp.path()
            .join("definitions")
            .join(format!("{}.toml", uuid(1))),
    )
    .unwrap();
    assert!(text.contains("[[attrs]]"), "{text}");
}

#[test]
fn a_definition_written_before_attributes_loads_with_none() {
    let tmp = tempfile::tempdir().unwrap();
    drop(StateDir::open(tmp.path()).unwrap());
    // The exact text an older vgpud wrote: no `attrs` key at all.
    let old = format!(
        "schema = 1\nuuid = \"{}\"\nparent = \"0000:3b:00.0\"\ngpu = \"0000:3b:00.0\"\ntype_id = \"nvidia-231\"\nprofile = \"vdi-2g\"\nautostart = true\nlabel = \"vm-2\"\ncreated_at = 1700000002\n",
        uuid(2)
    );
    plant(
        tmp.path(),
        "definitions",
        &format!("{}.toml", uuid(2)),
        old.as_bytes(),
    );
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert!(report.set_aside.is_empty(), "{report:#?}");
    assert_eq!(s.get_definition(&uuid(2)), Some(&def(2)));
    assert!(
        def(2).encode().unwrap() == old,
        "no attrs: the file is as before"
    );
}

#[test]
fn bad_attributes_in_a_file_set_it_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let good = with_attrs(1, &[("a", "1")]).encode().unwrap();
    let cases = [
        (
            3,
            good.replace("name = \"a\"", "name = \"../remove\""),
            "not a file name",
        ),
        (4, format!("{good}extra = 1\n"), "unknown field"),
        (5, good.replace("value = \"1\"\n", ""), "value"),
    ];
    {
        let _ = StateDir::open(tmp.path()).unwrap();
    }
    for (n, text, _) in &cases {
        let text = text.replace(&uuid(1).to_string(), &uuid(*n).to_string());
        plant(
            tmp.path(),
            "definitions",
            &format!("{}.toml", uuid(*n)),
            text.as_bytes(),
        );
    }
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert!(defs_of(&s).is_empty());
    for (n, _, needle) in &cases {
        let aside = report
            .set_aside
            .iter()
            .find(|a| a.file.ends_with(format!("{}.toml", uuid(*n))))
            .unwrap_or_else(|| panic!("{n} not set aside: {report:#?}"));
        let why = aside.reason.to_string();
        assert!(why.contains(needle), "{n}: {why}");
    }
}
