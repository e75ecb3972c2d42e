//! Sets of profiles: the shipped set embedded in the binary, and directories or files of an operator's.

use std::path::Path;

use serde::Serialize;

use super::error::{ProfileError, ProfileErrors};
use super::spec::Profile;
use crate::toml_file;

/// The shipped profiles (`profiles/*.toml` at the repository root), embedded so the binary works
/// without any installed files.
const BUILTIN: &[(&str, &str)] = &[
    ("vdi-1g.toml", include_str!("../../../profiles/vdi-1g.toml")),
    ("vdi-2g.toml", include_str!("../../../profiles/vdi-2g.toml")),
    (
        "workstation-4g.toml",
        include_str!("../../../profiles/workstation-4g.toml"),
    ),
    (
        "compute-8g.toml",
        include_str!("../../../profiles/compute-8g.toml"),
    ),
    (
        "passthrough.toml",
        include_str!("../../../profiles/passthrough.toml"),
    ),
    (
        "sample-display-16m.toml",
        include_str!("../../../profiles/sample-display-16m.toml"),
    ),
    (
        "sample-display-4m.toml",
        include_str!("../../../profiles/sample-display-4m.toml"),
    ),
    (
        "sample-display-1080p.toml",
        include_str!("../../../profiles/sample-display-1080p.toml"),
    ),
];

/// A set of profiles with unique names, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Catalog {
    profiles: Vec<Profile>,
}

impl Catalog {
    /// The profiles shipped with vgpu-manager. Fails only if a shipped file is broken, which the
    /// tests rule out.
    pub fn builtin() -> Result<Catalog, ProfileErrors> {
        let mut profiles = Vec::new();
        let mut errors = Vec::new();
        for (file, text) in BUILTIN {
            match Profile::from_toml(&format!("builtin:{file}"), text) {
                Ok(p) => profiles.push(p),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(ProfileErrors(errors));
        }
        Catalog::from_profiles(profiles)
    }

    /// Every `*.toml` file in `dir` (not recursing), in name order. All files are checked before
    /// failing, and the error lists every problem.
    pub fn load_dir(dir: &Path) -> Result<Catalog, ProfileErrors> {
        let files = toml_file::list(dir).map_err(|e| ProfileErrors(vec![e]))?;
        let mut profiles = Vec::new();
        let mut errors = Vec::new();
        for r in check_files(&files) {
            match r {
                Ok(p) => profiles.push(p),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(ProfileErrors(errors));
        }
        Catalog::from_profiles(profiles)
    }

    /// One profile file.
    pub fn load_file(path: &Path) -> Result<Profile, ProfileError> {
        let text = toml_file::read::<ProfileError>(path)?;
        Profile::from_toml(&path.display().to_string(), &text)
    }

    /// A catalog of `profiles`, which must have unique names.
    pub fn from_profiles(mut profiles: Vec<Profile>) -> Result<Catalog, ProfileErrors> {
        let mut errors = Vec::new();
        let mut seen: Vec<&Profile> = Vec::new();
        for p in &profiles {
            match seen.iter().find(|q| q.name == p.name) {
                Some(first) => errors.push(ProfileError::Duplicate {
                    origin: p.origin.clone(),
                    name: p.name.clone(),
                    first: first.origin.clone(),
                }),
                None => seen.push(p),
            }
        }
        if !errors.is_empty() {
            return Err(ProfileErrors(errors));
        }
        profiles.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Catalog { profiles })
    }

    /// This catalog with `other`'s profiles added; a profile of `other` replaces one of the same
    /// name here (an operator's directory overriding the shipped set).
    pub fn overlay(mut self, other: Catalog) -> Catalog {
        for p in other.profiles {
            self.profiles.retain(|q| q.name != p.name);
            self.profiles.push(p);
        }
        self.profiles.sort_by(|a, b| a.name.cmp(&b.name));
        self
    }

    /// The profile called `name`.
    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Every profile, sorted by name.
    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    /// Every name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.profiles.iter().map(|p| p.name.as_str()).collect()
    }

    /// What a user typed as PROFILE: a file when it names one (contains `/` or ends in `.toml`),
    /// otherwise a profile name in this catalog.
    pub fn resolve(&self, name_or_path: &str) -> Result<Profile, ProfileError> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            return Catalog::load_file(Path::new(name_or_path));
        }
        self.get(name_or_path)
            .cloned()
            .ok_or_else(|| ProfileError::Unknown {
                name: name_or_path.to_string(),
                known: self.names().join(", "),
            })
    }
}

/// Checks each file on its own (for `vgpuctl profiles check FILE…`): one result per path, in order.
pub fn check_files<P: AsRef<Path>>(paths: &[P]) -> Vec<Result<Profile, ProfileError>> {
    paths
        .iter()
        .map(|p| Catalog::load_file(p.as_ref()))
        .collect()
}
