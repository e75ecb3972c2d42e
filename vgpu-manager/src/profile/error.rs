//! Errors of loading and validating profiles. Each names the file (and line and field where it has
//! them) and says what would be accepted.

use std::path::PathBuf;

use thiserror::Error;

/// Why a profile (or a set of profiles) could not be loaded.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("{}: cannot read profile: {source}", path.display())]
    Read {
        /// The profile file that could not be read.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A profile directory could not be listed.
    #[error("{}: cannot list profile directory: {source}", path.display())]
    ReadDir {
        /// The profile directory that could not be listed.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown or missing field, or a value of the wrong type (the message from the
    /// TOML reader, which lists the expected fields or type).
    #[error("{origin}:{line}:{column}: {message}")]
    Toml {
        /// Where the text came from.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// A field holds a value outside what is allowed.
    #[error("{origin}:{line}: field `{field}` {problem}; allowed: {allowed}")]
    Field {
        /// Where the text came from.
        origin: String,
        /// 1-based line of the value.
        line: usize,
        /// The name of the profile field whose value is wrong.
        field: &'static str,
        /// What is wrong with the value.
        problem: String,
        /// What would be accepted.
        allowed: String,
    },
    /// Every field is valid but together they exclude every GPU on every host.
    #[error("{origin}:{line}: profile '{name}' can never match: {reason}")]
    NeverMatches {
        /// Where the text came from.
        origin: String,
        /// 1-based line of the field at fault (usually `backends`).
        line: usize,
        /// The name of the profile that never matches.
        name: String,
        /// Why, and what to change.
        reason: String,
    },
    /// Two profiles of one catalog have the same name.
    #[error(
        "{origin}: profile name '{name}' is already used by {first}; give each profile a unique name"
    )]
    Duplicate {
        /// Where the second definition came from (a path or `builtin:NAME.toml`).
        origin: String,
        /// The profile name both definitions use.
        name: String,
        /// Where the first definition came from.
        first: String,
    },
    /// A profile asked for by name is in no catalog.
    #[error(
        "unknown profile '{name}': known profiles are {known}; or give the path of a .toml file"
    )]
    Unknown {
        /// The profile name that was asked for and is in no catalog.
        name: String,
        /// The names that exist, comma-separated.
        known: String,
    },
}

crate::toml_file::impl_file_error!(ProfileError);

/// Several profile errors (a whole directory is checked before giving up).
#[derive(Debug, Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct ProfileErrors(pub Vec<ProfileError>);
