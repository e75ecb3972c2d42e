//! Definitions of one UUID on several parents: the main one and its alternates, kept across reopens
//! and crashes.

use super::*;

/// Definition `n` on `parent`.
fn on(n: u32, parent: &str) -> Definition {
    Definition {
        parent: parent.into(),
        gpu: parent.into(),
        ..def(n)
    }
}

fn defs_dir(root: &Path) -> PathBuf {
    root.join("definitions")
}

/// (main parent, alternate parents) of UUID `n`.
fn layout(s: &StateDir, n: u32) -> (Option<String>, Vec<String>) {
    (
        s.get_definition(&uuid(n)).map(|d| d.parent.clone()),
        s.alternates_of(&uuid(n))
            .map(|d| d.parent.clone())
            .collect(),
    )
}

fn names(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(defs_dir(root))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn alternates_survive_a_reopen_and_are_found_by_parent() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&on(1, "mtty")).unwrap();
        s.put_alternate(&on(1, "0000:3b:00.0")).unwrap();
        s.put_alternate(&on(1, "0000:00:02.0")).unwrap();
        s.put_definition(&on(2, "mtty")).unwrap();
    }
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert!(report.set_aside.is_empty(), "{report:#?}");
    assert_eq!(report.definitions, 4);
    assert_eq!(
        layout(&s, 1),
        (
            Some("mtty".into()),
            vec!["0000:00:02.0".into(), "0000:3b:00.0".into()]
        )
    );
    assert_eq!(layout(&s, 2), (Some("mtty".into()), vec![]));
    assert_eq!(s.definitions().len(), 2);
    assert_eq!(s.alternates().len(), 2);
    assert_eq!(
        s.definition_on(&uuid(1), "0000:3b:00.0"),
        Some(&on(1, "0000:3b:00.0"))
    );
    assert_eq!(s.definition_on(&uuid(1), "mtty"), Some(&on(1, "mtty")));
    assert_eq!(s.definition_on(&uuid(2), "0000:3b:00.0"), None);
    assert!(
        names(tmp.path()).contains(&format!("{}@0000:3b:00.0.toml", uuid(1))),
        "{:?}",
        names(tmp.path())
    );
}

#[test]
fn an_alternate_needs_a_main_definition_on_another_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    let e = s.put_alternate(&on(1, "mtty")).unwrap_err();
    assert!(e.to_string().contains("no main definition"), "{e}");
    s.put_definition(&on(1, "mtty")).unwrap();
    let e = s.put_alternate(&on(1, "mtty")).unwrap_err();
    assert!(e.to_string().contains("define it instead"), "{e}");
    assert_eq!(s.alternates().len(), 0);
    assert_eq!(names(tmp.path()), vec![format!("{}.toml", uuid(1))]);
}

#[test]
fn selecting_swaps_main_and_alternate_durably() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&on(1, "mtty")).unwrap();
        s.put_alternate(&on(1, "0000:3b:00.0")).unwrap();
        assert!(s.select_definition(&uuid(1), "0000:3b:00.0").unwrap());
        assert!(!s.select_definition(&uuid(1), "0000:3b:00.0").unwrap());
        assert!(!s.select_definition(&uuid(1), "nowhere").unwrap());
        assert_eq!(
            layout(&s, 1),
            (Some("0000:3b:00.0".into()), vec!["mtty".into()])
        );
    }
    let (s, _) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(
        layout(&s, 1),
        (Some("0000:3b:00.0".into()), vec!["mtty".into()])
    );
    assert_eq!(
        names(tmp.path()),
        vec![
            format!("{}.toml", uuid(1)),
            format!("{}@mtty.toml", uuid(1))
        ]
    );
}

#[test]
fn removing_the_main_definition_promotes_an_alternate() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&on(1, "mtty")).unwrap();
        s.put_alternate(&on(1, "0000:3b:00.0")).unwrap();
        s.put_alternate(&on(1, "0000:00:02.0")).unwrap();
        let gone = s.remove_definition(&uuid(1)).unwrap();
        assert_eq!(gone, Some(on(1, "mtty")));
        assert_eq!(
            layout(&s, 1),
            (Some("0000:00:02.0".into()), vec!["0000:3b:00.0".into()])
        );
        assert_eq!(
            s.remove_alternate(&uuid(1), "0000:3b:00.0").unwrap(),
            Some(on(1, "0000:3b:00.0"))
        );
    }
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(layout(&s, 1), (Some("0000:00:02.0".into()), vec![]));
    assert_eq!(
        s.remove_definition(&uuid(1)).unwrap(),
        Some(on(1, "0000:00:02.0"))
    );
    assert_eq!(layout(&s, 1), (None, vec![]));
    assert!(names(tmp.path()).is_empty(), "{:?}", names(tmp.path()));
}

#[test]
fn putting_a_main_definition_on_an_alternates_parent_supersedes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    s.put_definition(&on(1, "mtty")).unwrap();
    s.put_alternate(&on(1, "0000:3b:00.0")).unwrap();
    s.put_definition(&on(1, "0000:3b:00.0")).unwrap();
    assert_eq!(layout(&s, 1), (Some("0000:3b:00.0".into()), vec![]));
    assert_eq!(names(tmp.path()), vec![format!("{}.toml", uuid(1))]);
}

/// Every state an interrupted select or promotion can leave (the files after each durable step)
/// reads back as both definitions, each once, with a main one.
#[test]
fn a_crash_inside_a_select_or_a_promotion_loses_no_definition() {
    let main = on(1, "mtty");
    let alt = on(1, "0000:3b:00.0");
    let main_file = format!("{}.toml", uuid(1));
    let alt_file = |p: &str| format!("{}@{p}.toml", uuid(1));
    // (main file holds, alternate files) after each step of select_definition(alt's parent):
    // step 1 wrote mtty as an alternate; step 2 wrote the chosen one over the main file.
    let states: Vec<(&Definition, Vec<&Definition>)> = vec![
        (&main, vec![&main, &alt]),
        (&alt, vec![&main, &alt]),
        // remove_definition's promotion: the main file replaced, the alternate not yet removed.
        (&alt, vec![&alt]),
    ];
    for (i, (in_main, alts)) in states.into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        drop(StateDir::open(tmp.path()).unwrap());
        let dir = defs_dir(tmp.path());
        fs::write(dir.join(&main_file), in_main.encode().unwrap()).unwrap();
        for a in alts {
            fs::write(dir.join(alt_file(&a.parent)), a.encode().unwrap()).unwrap();
        }
        let (s, report) = StateDir::open(tmp.path()).unwrap();
        assert!(report.set_aside.is_empty(), "state {i}: {report:#?}");
        let main_parent = in_main.parent.clone();
        let mut all: Vec<Definition> = s.definitions().chain(s.alternates()).cloned().collect();
        all.sort_by(|a, b| a.parent.cmp(&b.parent));
        let mut want = if i == 2 {
            vec![alt.clone()]
        } else {
            vec![main.clone(), alt.clone()]
        };
        want.sort_by(|a, b| a.parent.cmp(&b.parent));
        assert_eq!(all, want, "state {i}");
        assert_eq!(
            s.get_definition(&uuid(1)).map(|d| d.parent.clone()),
            Some(main_parent),
            "state {i}"
        );
        // The repeated file is gone from disk too.
        drop(s);
        let (again, _) = StateDir::open(tmp.path()).unwrap();
        assert_eq!(
            again.definitions().len() + again.alternates().len(),
            want.len()
        );
        let on_disk = names(tmp.path());
        assert_eq!(on_disk.len(), want.len(), "state {i}: {on_disk:?}");
    }
}

#[test]
fn an_alternate_without_a_main_file_becomes_the_main_definition() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&on(1, "mtty")).unwrap();
        s.put_alternate(&on(1, "0000:3b:00.0")).unwrap();
    }
    fs::remove_file(defs_dir(tmp.path()).join(format!("{}.toml", uuid(1)))).unwrap();
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert!(report.set_aside.is_empty(), "{report:#?}");
    assert_eq!(layout(&s, 1), (Some("0000:3b:00.0".into()), vec![]));
    assert_eq!(names(tmp.path()), vec![format!("{}.toml", uuid(1))]);
}

#[test]
fn an_alternate_file_naming_another_parent_than_it_holds_is_set_aside() {
    let tmp = tempfile::tempdir().unwrap();
    drop(StateDir::open(tmp.path()).unwrap());
    let dir = defs_dir(tmp.path());
    fs::write(
        dir.join(format!("{}.toml", uuid(1))),
        on(1, "mtty").encode().unwrap(),
    )
    .unwrap();
    fs::write(
        dir.join(format!("{}@elsewhere.toml", uuid(1))),
        on(1, "0000:3b:00.0").encode().unwrap(),
    )
    .unwrap();
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(report.set_aside.len(), 1, "{report:#?}");
    assert!(
        report.set_aside[0].reason.to_string().contains("elsewhere"),
        "{report:#?}"
    );
    assert_eq!(layout(&s, 1), (Some("mtty".into()), vec![]));
}
