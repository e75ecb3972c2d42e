//! XML escaping for everything we interpolate into libvirt XML. Values come from outside (domain names,
//! labels, paths), so every attribute value and text node goes through here (XML 1.0 §2.4 "Character
//! Data and Markup": `&` and `<` must be escaped everywhere, the quote that delimits an attribute inside
//! it; we escape both quotes and `>` too so the result is safe in any position).

use std::borrow::Cow;

/// Escapes `s` for use inside a single- or double-quoted attribute value or as element text.
///
/// Control characters other than tab, newline and carriage return are not allowed in XML 1.0 at all
/// (§2.2 "Characters"); they are dropped rather than emitted as an invalid document.
pub fn escape(s: &str) -> Cow<'_, str> {
    let needs = s
        .chars()
        .any(|c| matches!(c, '&' | '<' | '>' | '\'' | '"') || is_forbidden(c));
    if !needs {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c if is_forbidden(c) => {}
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Characters XML 1.0 does not allow in a document (§2.2): C0 controls except tab, LF and CR, and the
/// non-characters U+FFFE/U+FFFF. (Surrogates cannot occur in a Rust `str`.)
fn is_forbidden(c: char) -> bool {
    (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || c == '\u{FFFE}' || c == '\u{FFFF}'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(escape("vdi-01"), Cow::Borrowed("vdi-01")));
    }

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(escape(r#"a&b<c>d'e"f"#), "a&amp;b&lt;c&gt;d&apos;e&quot;f");
    }

    #[test]
    fn forbidden_controls_are_dropped_but_whitespace_kept() {
        assert_eq!(escape("a\u{1}b\tc\nd\u{FFFF}"), "ab\tc\nd");
    }

    #[test]
    fn escaped_text_round_trips_through_a_parser() {
        let nasty = "x'\"<&>]]>y";
        let doc = format!("<a v='{}'>{}</a>", escape(nasty), escape(nasty));
        let parsed = roxmltree::Document::parse(&doc).unwrap_or_else(|e| panic!("{e}: {doc}"));
        let root = parsed.root_element();
        assert_eq!(root.attribute("v"), Some(nasty));
        assert_eq!(root.text(), Some(nasty));
    }
}
