//! Why a simulated host could not be loaded.

use std::path::PathBuf;

use thiserror::Error;

/// A simulated host description that could not be found, read, parsed or accepted. Messages name the
/// file, line and field, and say what to change.
#[derive(Debug, Error)]
pub enum SimError {
    /// Neither a builtin host name nor a readable file.
    #[error(
        "unknown simulated host '{name}': use one of {known}, or a path to a TOML host description"
    )]
    UnknownBuiltin {
        /// What was asked for.
        name: String,
        /// The builtin names, comma-separated.
        known: String,
    },
    /// The file could not be read.
    #[error("cannot read simulated host description {path}: {source}")]
    Io {
        /// The simulated host description file that could not be read.
        path: PathBuf,
        /// The I/O error from reading it.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or does not fit the schema (unknown field, wrong type, bad value).
    #[error("{file}:{line}:{column}: {field}: {message}")]
    Toml {
        /// The description's file name.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// Where in the schema, e.g. `pci[3].address`.
        field: String,
        /// The parser's explanation.
        message: String,
    },
    /// The TOML parsed but describes an impossible host (unknown driver, duplicate address, …).
    #[error("{file}{}: {field}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        /// The description's file name (`<spec>` when built from a value).
        file: String,
        /// 1-based line of the offending field, when it can be located.
        line: Option<usize>,
        /// Where in the schema, e.g. `mdev_parent[0].type[2].uses.framebuffer_mib`.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl SimError {
    /// The schema path this error is about (`pci[3].address`), when it concerns one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            SimError::Toml { field, .. } | SimError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The 1-based line this error points at, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            SimError::Toml { line, .. } => Some(*line),
            SimError::Invalid { line, .. } => *line,
            _ => None,
        }
    }
}
