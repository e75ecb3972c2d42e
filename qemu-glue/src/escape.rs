//! XML escaping for everything we interpolate into libvirt XML. Values come from outside (domain names,
//! labels, paths), so every attribute value and text node goes through here (XML 1.0 §2.4 "Character
//! Data and Markup": `&` and `<` must be escaped everywhere, the quote that delimits an attribute inside
//! it; we escape both quotes and `>` too so the result is safe in any position).

use std::borrow::Cow;

/// Escapes `s` for use as element text (and, without tabs or line ends, inside a single- or double-quoted
/// attribute value; [`escape_attr`] handles those).
///
/// Control characters other than tab, newline and carriage return are not allowed in XML 1.0 at all
/// (§2.2 "Characters"); they are dropped rather than emitted as an invalid document. A carriage return is
/// written as `&#13;`: a parser turns a raw one into a newline (§2.11 "End-of-Line Handling").
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_with(s, false)
}

/// Escapes `s` for use inside a single- or double-quoted attribute value: as [`escape`], and tabs and
/// newlines too are written as character references (`&#9;`, `&#10;`), because a parser turns raw ones
/// into spaces (§3.3.3 "Attribute-Value Normalization").
pub fn escape_attr(s: &str) -> Cow<'_, str> {
    escape_with(s, true)
}

fn escape_with(s: &str, attr: bool) -> Cow<'_, str> {
    let special = |c: char| {
        matches!(c, '&' | '<' | '>' | '\'' | '"' | '\r')
            || (attr && matches!(c, '\t' | '\n'))
            || is_forbidden(c)
    };
    if !s.chars().any(special) {
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
            '\r' => out.push_str("&#13;"),
            '\t' if attr => out.push_str("&#9;"),
            '\n' if attr => out.push_str("&#10;"),
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

    // Found by the fuzz target domain_xml: a domain name with a carriage return read back with a
    // newline, a profile name with a tab read back with a space.
    #[test]
    fn whitespace_round_trips_through_a_parser() {
        let ws = "a\tb\nc\rd\r\ne";
        let doc = format!("<a v='{}'>{}</a>", escape_attr(ws), escape(ws));
        let parsed = roxmltree::Document::parse(&doc).unwrap_or_else(|e| panic!("{e}: {doc}"));
        let root = parsed.root_element();
        assert_eq!(root.attribute("v"), Some(ws), "{doc}");
        assert_eq!(root.text(), Some(ws), "{doc}");
    }
}
