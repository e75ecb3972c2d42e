//! Maps TOML source lines to schema paths (`pci[3].sriov.total_vfs`) so every error can name both the
//! line and the field, for parse errors (which carry a byte span) and for semantic errors found after
//! parsing (which carry a schema path).

use std::collections::HashMap;

/// What one source line is about.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LineInfo {
    /// The table the line belongs to, e.g. `mdev_parent[0].type[3]` (empty for the root table).
    table: String,
    /// The key set on this line, if it is a `key = value` line.
    key: Option<String>,
    /// The line is a table header.
    header: bool,
}

/// Schema paths of every line of a TOML document written with table headers.
#[derive(Debug, Clone)]
pub(crate) struct Locator {
    lines: Vec<LineInfo>,
}

/// The bare or quoted key at the start of `line`, before `=`.
fn key_of(line: &str) -> Option<String> {
    let t = line.trim_start();
    if t.starts_with('#') || t.starts_with('[') {
        return None;
    }
    let (k, _) = t.split_once('=')?;
    let k = k.trim().trim_matches('"').trim_matches('\'');
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then(|| k.to_string())
}

impl Locator {
    /// Scans `text`, tracking `[table]` and `[[array]]` headers and their indexes.
    pub(crate) fn new(text: &str) -> Self {
        // Occurrences of each array-of-tables header, relative to its enclosing array element.
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut table = String::new();
        let mut lines = Vec::new();
        for line in text.lines() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split(']').next()) {
                let name = name.trim().to_string();
                *counts.entry(name.clone()).or_insert(0) += 1;
                let prefix = format!("{name}.");
                counts.retain(|k, _| !k.starts_with(&prefix));
                table = render(&name, &counts);
                lines.push(LineInfo {
                    table: table.clone(),
                    key: None,
                    header: true,
                });
            } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
                table = render(name.trim(), &counts);
                lines.push(LineInfo {
                    table: table.clone(),
                    key: None,
                    header: true,
                });
            } else {
                lines.push(LineInfo {
                    table: table.clone(),
                    key: key_of(line),
                    header: false,
                });
            }
        }
        Self { lines }
    }

    /// The schema path of 1-based `line`: `table.key`, or the table for a header or continuation line.
    pub(crate) fn path_at(&self, line: usize) -> String {
        let Some(info) = line.checked_sub(1).and_then(|i| self.lines.get(i)) else {
            return String::new();
        };
        match &info.key {
            Some(k) if info.table.is_empty() => k.clone(),
            Some(k) => format!("{}.{k}", info.table),
            None if info.header => info.table.clone(),
            None => {
                // A continuation line of a multi-line value: the nearest key above in the same table.
                let idx = line - 1;
                self.lines[..idx]
                    .iter()
                    .rev()
                    .take_while(|l| !l.header)
                    .find_map(|l| l.key.clone())
                    .map(|k| join(&info.table, &k))
                    .unwrap_or_else(|| info.table.clone())
            }
        }
    }

    /// The 1-based line where the schema path `path` is set: the `key =` line in its table, else the
    /// line of the closest enclosing field or table header.
    pub(crate) fn line_of(&self, path: &str) -> Option<usize> {
        let mut path = path.to_string();
        loop {
            let (table, key) = match path.rsplit_once('.') {
                Some((t, k)) => (t.to_string(), k.to_string()),
                None => (String::new(), path.clone()),
            };
            // `table.key = …` inside `table`.
            if let Some(i) = self
                .lines
                .iter()
                .position(|l| l.table == table && l.key.as_deref() == Some(key.as_str()))
            {
                return Some(i + 1);
            }
            // `path` names a table: its header.
            if let Some(i) = self.lines.iter().position(|l| l.header && l.table == path) {
                return Some(i + 1);
            }
            // Try the enclosing field (e.g. an inline table `uses = { … }`).
            if table.is_empty() {
                return None;
            }
            path = strip_index(&table);
            if path.is_empty() {
                return None;
            }
            if path != table {
                // `a[3]` → look for the header of `a[3]` first, then go up.
                if let Some(i) = self.lines.iter().position(|l| l.header && l.table == table) {
                    return Some(i + 1);
                }
            }
        }
    }
}

/// `a.b` or `b` when `a` is empty.
fn join(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_string()
    } else {
        format!("{table}.{key}")
    }
}

/// `x[3]` → `x` (unchanged when there is no trailing index).
fn strip_index(path: &str) -> String {
    match path.strip_suffix(']').and_then(|p| p.rsplit_once('[')) {
        Some((base, _)) => base.to_string(),
        None => path.to_string(),
    }
}

/// Renders a dotted header name as a schema path with array indexes: `mdev_parent.type` becomes
/// `mdev_parent[0].type[2]` when those are the current elements.
fn render(name: &str, counts: &HashMap<String, usize>) -> String {
    let mut out = String::new();
    let mut prefix = String::new();
    for seg in name.split('.') {
        let seg = seg.trim().trim_matches('"');
        if !prefix.is_empty() {
            prefix.push('.');
        }
        prefix.push_str(seg);
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(seg);
        if let Some(n) = counts.get(&prefix) {
            out.push_str(&format!("[{}]", n.saturating_sub(1)));
        }
    }
    out
}

/// 1-based line and column of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let upto = &text[..offset.min(text.len())];
    let line = upto.matches('\n').count() + 1;
    let col = upto.rfind('\n').map_or(upto.len(), |i| upto.len() - i - 1) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
[host]
numa_nodes = 2

[[pci]]
address = \"0000:00:02.0\"

[[pci]]
address = \"0000:01:00.0\"
[pci.sriov]
total_vfs = 7

[[mdev_parent]]
device = \"mtty\"
[[mdev_parent.type]]
id = \"mtty-1\"
[[mdev_parent.type]]
id = \"mtty-2\"
uses = { ports = 2 }

[[mdev_parent]]
device = \"mbochs\"
[[mdev_parent.type]]
id = \"mbochs-small\"
";

    #[test]
    fn lines_map_to_schema_paths_and_back() {
        let l = Locator::new(DOC);
        assert_eq!(l.path_at(2), "host.numa_nodes");
        assert_eq!(l.path_at(8), "pci[1].address");
        assert_eq!(l.path_at(10), "pci[1].sriov.total_vfs");
        assert_eq!(l.path_at(17), "mdev_parent[0].type[1].id");
        assert_eq!(l.path_at(23), "mdev_parent[1].type[0].id");
        assert_eq!(l.line_of("pci[1].address"), Some(8));
        assert_eq!(l.line_of("pci[1].sriov.total_vfs"), Some(10));
        assert_eq!(l.line_of("mdev_parent[0].type[1].uses.ports"), Some(18));
        assert_eq!(l.line_of("mdev_parent[1].type[0].name"), Some(22));
        assert_eq!(l.line_of("pci[0].driver"), Some(4));
        assert_eq!(l.line_of("nothing[3].here"), None);
        assert_eq!(line_col(DOC, 0), (1, 1));
        assert_eq!(line_col(DOC, 7), (2, 1));
    }
}
