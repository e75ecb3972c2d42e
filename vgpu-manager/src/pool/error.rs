//! Errors of loading pools and planning them. Each names the file (with line and field where it has
//! them) or the pool, and says what would be accepted.

use std::path::PathBuf;

use thiserror::Error;

use crate::placement::ModelError;

/// Why a pool could not be loaded or planned.
#[derive(Debug, Error)]
pub enum PoolError {
    /// The file could not be read.
    #[error("{}: cannot read pool file: {source}", path.display())]
    Read {
        /// The pool file that could not be read.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The pool directory could not be listed.
    #[error("{}: cannot list pool directory: {source} (create it, or give another with --pools-dir)", path.display())]
    ReadDir {
        /// The pool directory that could not be listed.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown or missing field, or a value of the wrong type.
    #[error("{origin}:{line}:{column}: {message}")]
    Toml {
        /// Where the text came from.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the TOML reader said (it lists the expected fields).
        message: String,
    },
    /// A field holds a value outside what is allowed.
    #[error("{origin}:{line}: field `{field}` {problem}; allowed: {allowed}")]
    Field {
        /// Where the text came from.
        origin: String,
        /// 1-based line of the value.
        line: usize,
        /// The name of the pool field whose value is wrong.
        field: &'static str,
        /// What is wrong.
        problem: String,
        /// What would be accepted.
        allowed: String,
    },
    /// Two pools have the same name.
    #[error(
        "{origin}: pool name '{name}' is already used by {first}; give each pool a unique name"
    )]
    Duplicate {
        /// Where the second definition came from (its pool file).
        origin: String,
        /// The pool name both definitions use.
        name: String,
        /// Where the first definition came from.
        first: String,
    },
    /// The planner was given an inconsistent problem (a bug in building it).
    #[error("pool '{pool}': {source}")]
    Model {
        /// The name of the pool being planned.
        pool: String,
        /// The planner's complaint.
        #[source]
        source: ModelError,
    },
}

crate::toml_file::impl_file_error!(PoolError);

/// Several pool errors (a whole directory is checked before giving up).
#[derive(Debug, Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct PoolErrors(pub Vec<PoolError>);
