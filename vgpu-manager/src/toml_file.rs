//! What the profile and pool file formats share: names, reading a file, listing a directory of
//! `*.toml` files, parsing with the TOML reader's position turned into a line and column, and field
//! errors that name the line of a value. Each format keeps its own error enum (its messages say
//! "profile" or "pool"); it implements [`FileError`] so these helpers can build its variants.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// The error variants a TOML file format has, built by the helpers of this module.
pub(crate) trait FileError: Sized {
    /// The file at `path` could not be read.
    fn read(path: PathBuf, source: io::Error) -> Self;
    /// The directory at `path` could not be listed.
    fn read_dir(path: PathBuf, source: io::Error) -> Self;
    /// The text from `origin` is not TOML of the format (the reader's `message`, at a 1-based
    /// `line` and `column`).
    fn toml(origin: String, line: usize, column: usize, message: String) -> Self;
    /// `field` on 1-based `line` of `origin` has a value outside what is allowed.
    fn field(
        origin: String,
        line: usize,
        field: &'static str,
        problem: String,
        allowed: String,
    ) -> Self;
}

/// 1-based line and column of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Whether `s` is a valid profile or pool name: 1-64 lower-case letters, digits and `-`, starting
/// with a letter or digit.
pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The text of the file at `path`.
pub(crate) fn read<E: FileError>(path: &Path) -> Result<String, E> {
    std::fs::read_to_string(path).map_err(|source| E::read(path.to_path_buf(), source))
}

/// Every `*.toml` file directly in `dir` (not recursing), in name order.
pub(crate) fn list<E: FileError>(dir: &Path) -> Result<Vec<PathBuf>, E> {
    let err = |source| E::read_dir(dir.to_path_buf(), source);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// `text` read as `T`; a syntax, type or unknown-field error names `origin`, line and column.
pub(crate) fn parse<T: DeserializeOwned, E: FileError>(origin: &str, text: &str) -> Result<T, E> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = line_col(text, e.span().map_or(0, |s| s.start));
        E::toml(
            origin.to_string(),
            line,
            column,
            e.message().trim_end().to_string(),
        )
    })
}

/// One text being validated: builds field errors that name its origin and the value's line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    /// Where the text came from (a path, `builtin:NAME.toml`, `dbus`).
    pub origin: &'a str,
    /// The whole TOML text, used to find the line of a value.
    pub text: &'a str,
}

impl Source<'_> {
    /// The 1-based line where `span` starts.
    pub fn line(&self, span: Range<usize>) -> usize {
        line_col(self.text, span.start).0
    }

    /// A field error for the value at `span`.
    pub fn field<E: FileError>(
        &self,
        span: Range<usize>,
        field: &'static str,
        problem: impl Into<String>,
        allowed: impl Into<String>,
    ) -> E {
        E::field(
            self.origin.to_string(),
            self.line(span),
            field,
            problem.into(),
            allowed.into(),
        )
    }
}

/// Implements [`FileError`] for an error enum whose `Read`, `ReadDir`, `Toml` and `Field` variants
/// have the fields of the trait's arguments.
macro_rules! impl_file_error {
    ($t:ty) => {
        impl $crate::toml_file::FileError for $t {
            fn read(path: std::path::PathBuf, source: std::io::Error) -> Self {
                Self::Read { path, source }
            }
            fn read_dir(path: std::path::PathBuf, source: std::io::Error) -> Self {
                Self::ReadDir { path, source }
            }
            fn toml(origin: String, line: usize, column: usize, message: String) -> Self {
                Self::Toml {
                    origin,
                    line,
                    column,
                    message,
                }
            }
            fn field(
                origin: String,
                line: usize,
                field: &'static str,
                problem: String,
                allowed: String,
            ) -> Self {
                Self::Field {
                    origin,
                    line,
                    field,
                    problem,
                    allowed,
                }
            }
        }
    };
}
pub(crate) use impl_file_error;

#[cfg(test)]
mod tests {
    use super::line_col;

    #[test]
    fn line_and_column_are_one_based_and_count_characters() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 6), (2, 1));
        // After `bé ` (4 bytes, 3 characters).
        assert_eq!(line_col(text, 10), (2, 4));
        // Past the end: the whole text.
        assert_eq!(line_col(text, 999), (3, 1));
    }
}
