//! Key/value entries shared by the NVIDIA (`key=value, …`) and GVT-g (`key: value` lines) formats.

use super::{ParseError, shorten};

/// The entries of one description, with lookups that produce named errors.
pub(super) struct Fields<'a> {
    /// What is being parsed, for errors.
    what: &'static str,
    /// The whole text, for errors.
    text: &'a str,
    /// The full expected form, for errors.
    expected: &'static str,
    /// `(key, value)`, both trimmed, in text order; keys are unique.
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Fields<'a> {
    /// Splits `text` into entries at `entry_sep`, each entry into key and value at its first
    /// `kv_sep`. Blank entries are skipped (a trailing separator or newline); an entry without
    /// `kv_sep`, with an empty key, or a repeated key is an error.
    pub(super) fn split(
        what: &'static str,
        text: &'a str,
        expected: &'static str,
        entry_sep: char,
        kv_sep: char,
    ) -> Result<Self, ParseError> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for entry in text.split(entry_sep).map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            let (key, value) = entry
                .split_once(kv_sep)
                .map(|(k, v)| (k.trim(), v.trim()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| ParseError::invalid(what, text, expected))?;
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(ParseError::DuplicateKey {
                    what,
                    key: shorten(key),
                    text: shorten(text),
                });
            }
            pairs.push((key, value));
        }
        Ok(Self {
            what,
            text,
            expected,
            pairs,
        })
    }

    /// The value of `key` parsed by `parse`; a missing key or a rejected value names `key`.
    pub(super) fn get<T>(
        &self,
        key: &'static str,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, ParseError> {
        let value = self
            .pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| ParseError::MissingKey {
                what: self.what,
                key,
                text: shorten(self.text),
                expected: self.expected,
            })?;
        parse(value).map_err(|e| ParseError::Field {
            what: self.what,
            key,
            source: Box::new(e),
        })
    }
}
