//! One-way layers inside a crate's `src/`, held to the code.
//!
//! `ARCHITECTURE.md` (at the workspace root) holds, for each crate whose
//! modules are layered, a table under a heading `Layers of <dir>/src`:
//! one row per top-level module (`foo.rs`, or `foo/` for `foo.rs` with
//! its folder), bottom to top, with its floor and what it owns. That table
//! is the one list of the layers: this test reads it and checks every
//! crate that has one (`pool/src` and `proxy/src`; it lives in pool, the
//! workspace root being no package), so the document and the code
//! cannot drift apart.
//!
//! The rule: a module may name only modules on a lower floor than its own
//! (or itself). Every `crate::…` path counts, in a `use` or inline in the
//! code, and a `super::` chain that climbs to the crate root; comments,
//! doc comments and string literals do not. A name at the crate root
//! that is no module (`crate::Upstream`, a re-export) belongs to the
//! crate root's own row (`lib.rs`), the top. The table must also match the
//! tree: every top-level module of `src/` has a row, every row a module.
//!
//! Run it alone: `cargo test -p sidecache-pool --test layers`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// The file that holds the layer tables.
const DOC: &str = "ARCHITECTURE.md";

/// What a heading says before the crate's folder.
const HEADING: &str = "Layers of ";

/// Crates whose table must be there (a deleted table must not pass).
const REQUIRED: &[&str] = &["pool/src", "proxy/src"];

/// One crate's layers, read from its table.
#[derive(Debug)]
struct Table {
    /// The folder, relative to the workspace root (`pool/src`).
    dir: String,
    /// Module name (`conn`, `lib`) → its floor.
    floors: BTreeMap<String, u32>,
    /// Module name → as the table spells it (`conn/`, `error.rs`).
    cells: BTreeMap<String, String>,
}

/// Every `Layers of <dir>/src` table in `doc`, in order.
fn layer_tables(doc: &str) -> Result<Vec<Table>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut tables = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        i += 1;
        if !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let Some(dir) = title.strip_prefix(HEADING) else {
            continue;
        };
        let dir = dir
            .trim()
            .trim_matches('`')
            .trim_end_matches('/')
            .to_string();
        // The first table after the heading, before the next heading.
        while i < lines.len() && !lines[i].trim().starts_with('|') {
            if lines[i].trim().starts_with('#') {
                return Err(format!("{DOC}: \"{title}\" is followed by no table"));
            }
            i += 1;
        }
        let mut table = Table {
            dir,
            floors: BTreeMap::new(),
            cells: BTreeMap::new(),
        };
        let mut last = 0;
        // Header and separator rows first.
        let mut row = 0;
        while i < lines.len() && lines[i].trim().starts_with('|') {
            let cells: Vec<&str> = lines[i].trim().trim_matches('|').split('|').collect();
            i += 1;
            row += 1;
            if row <= 2 {
                continue;
            }
            let [floor, module, owns, ..] = cells.as_slice() else {
                return Err(format!(
                    "{DOC}: a row of \"{title}\" has fewer than three cells"
                ));
            };
            let floor: u32 = floor.trim().parse().map_err(|_| {
                format!("{DOC}: \"{title}\": floor `{}` is no number", floor.trim())
            })?;
            let cell = module.trim().trim_matches('`').to_string();
            let name = cell
                .trim_end_matches('/')
                .trim_end_matches(".rs")
                .to_string();
            if name.is_empty() || owns.trim().is_empty() {
                return Err(format!(
                    "{DOC}: \"{title}\": row `{cell}` needs a module and what it owns"
                ));
            }
            if floor < last {
                return Err(format!(
                    "{DOC}: \"{title}\" goes bottom to top, but `{cell}` (floor {floor}) follows floor {last}"
                ));
            }
            last = floor;
            if table.floors.insert(name.clone(), floor).is_some() {
                return Err(format!("{DOC}: \"{title}\" names `{cell}` twice"));
            }
            table.cells.insert(name, cell);
        }
        tables.push(table);
    }
    Ok(tables)
}

/// `src` with comments, string and character literals blanked out (line
/// breaks kept, so positions keep their line numbers).
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let n = c.len();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, s: &[char]| {
        for &ch in s {
            out.push(if ch == '\n' { '\n' } else { ' ' });
        }
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < n {
        let prev_ident = i > 0 && ident(c[i - 1]);
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let end = (i..n).find(|&j| c[j] == '\n').unwrap_or(n);
            blank(&mut out, &c[i..end]);
            i = end;
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            // Block comments nest in Rust.
            let (mut j, mut depth) = (i + 2, 1);
            while j < n && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &c[i..j]);
            i = j;
        } else if !prev_ident && raw_string_at(&c, i).is_some() {
            let end = raw_string_at(&c, i).unwrap_or(n);
            blank(&mut out, &c[i..end]);
            i = end;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < n && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(n);
            blank(&mut out, &c[i..end]);
            i = end;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '"'); else a lifetime.
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 3..n).find(|&j| c[j] == '\'').map(|j| j + 1)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, &c[i..end]);
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The end of a raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i`.
fn raw_string_at(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"'
            && c[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&ch| ch == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// A module path named in the code: where, what was written, and the
/// top-level module it reaches (`None`: the crate root itself).
#[derive(Debug)]
struct Reach {
    line: usize,
    written: String,
    top: Option<String>,
}

/// The top-level modules (or the crate root) that `code` (comments and
/// literals blanked) names, for a file whose module path is `path`
/// (`["conn", "mux"]` for `conn/mux.rs`; empty for `lib.rs`).
fn reaches(code: &str, path: &[String]) -> Vec<Reach> {
    let c: Vec<char> = code.chars().collect();
    let n = c.len();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let word_at = |i: usize| -> String { c[i..].iter().take_while(|&&ch| ident(ch)).collect() };
    let line_at = |i: usize| c[..i].iter().filter(|&&ch| ch == '\n').count() + 1;
    // Inline modules (`mod tests { … }`) open at a brace depth.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut pending: Option<String> = None;
    let mut found = Vec::new();
    let mut i = 0;
    while i < n {
        let ch = c[i];
        if ch == '{' {
            depth += 1;
            if let Some(name) = pending.take() {
                inline.push((name, depth));
            }
            i += 1;
            continue;
        }
        if ch == '}' {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        if ch == ';' {
            pending = None;
        }
        if !ident(ch) || (i > 0 && (ident(c[i - 1]) || c[i - 1] == '$')) {
            i += 1;
            continue;
        }
        let word = word_at(i);
        let after = i + word.chars().count();
        if word == "mod" {
            let rest: String = c[after..].iter().take(200).collect();
            let name = rest.trim_start();
            let skipped = rest.len() - name.len();
            if skipped > 0 {
                let name: String = name.chars().take_while(|&ch| ident(ch)).collect();
                let tail = rest[skipped + name.len()..].trim_start();
                if !name.is_empty() && tail.starts_with('{') {
                    pending = Some(name);
                }
            }
            i = after;
            continue;
        }
        let preceded_by_path = i >= 2 && c[i - 1] == ':' && c[i - 2] == ':';
        let follows = |j: usize| c.get(j) == Some(&':') && c.get(j + 1) == Some(&':');
        if preceded_by_path || !follows(after) || (word != "crate" && word != "super") {
            i = after;
            continue;
        }
        let line = line_at(i);
        if word == "crate" {
            for (written, top) in crate_paths(&c, after + 2) {
                found.push(Reach {
                    line,
                    written: format!("crate::{written}"),
                    top,
                });
            }
            i = after + 2;
            continue;
        }
        // `super::super::…`: climb from this module (with its inline ones).
        let mut module: Vec<String> = path.to_vec();
        module.extend(inline.iter().map(|(m, _)| m.clone()));
        let mut j = i;
        let mut written = String::new();
        while word_at(j) == "super" && follows(j + 5) {
            module.pop();
            written.push_str("super::");
            j += 7;
        }
        if module.is_empty() {
            for (rest, top) in crate_paths(&c, j) {
                found.push(Reach {
                    line,
                    written: format!("{written}{rest}"),
                    top,
                });
            }
        }
        i = j;
    }
    found
}

/// The paths after a `crate::` at `i`: one, or each of a `{…}` group.
fn crate_paths(c: &[char], i: usize) -> Vec<(String, Option<String>)> {
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let head = |s: &str| -> (String, Option<String>) {
        let s = s.trim();
        let first: String = s.chars().take_while(|&ch| ident(ch)).collect();
        let shown: String = s.chars().take_while(|&ch| ident(ch) || ch == ':').collect();
        let shown = shown.trim_end_matches(':').to_string();
        // Something at the root itself: `crate::{self}`, a glob.
        let top = (!first.is_empty() && first != "self").then_some(first);
        (
            if shown.is_empty() {
                s.chars().take(1).collect()
            } else {
                shown
            },
            top,
        )
    };
    // A `use` group is short; a path, shorter.
    let rest: String = c[i..].iter().take(2000).collect();
    let rest = rest.trim_start();
    let Some(group) = rest.strip_prefix('{') else {
        return vec![head(rest)];
    };
    let mut items = Vec::new();
    let (mut depth, mut item) = (0usize, String::new());
    for ch in group.chars() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(ch);
    }
    items.push(item);
    items
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| head(s))
        .collect()
}

/// The module path of a file of `src/` (`conn/mux.rs` → `conn::mux`).
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The row a file of `src/` belongs to: its top-level module, `lib` or `main`.
fn layer_of(rel: &str) -> String {
    let first = rel.split('/').next().unwrap_or(rel);
    first.trim_end_matches(".rs").to_string()
}

/// Every import that reaches a layer not below its own: one line each,
/// naming the file (`dir/rel`) and the import.
fn check_sources(table: &Table, files: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (rel, src) in files {
        let layer = layer_of(rel);
        let Some(&floor) = table.floors.get(&layer) else {
            problems.push(format!(
                "{}/{rel}: module `{layer}` has no row in the table",
                table.dir
            ));
            continue;
        };
        // A root item that is no module is the crate root's.
        let root = if layer == "main" { "main" } else { "lib" };
        for r in reaches(&code_only(src), &module_path(rel)) {
            let target = match &r.top {
                Some(top) if table.floors.contains_key(top) && top != "lib" && top != "main" => {
                    top.clone()
                }
                _ => root.to_string(),
            };
            if target == layer {
                continue;
            }
            let Some(&to) = table.floors.get(&target) else {
                problems.push(format!(
                    "{}/{rel}:{}: `{}` reaches `{target}`, which has no row in the table",
                    table.dir, r.line, r.written
                ));
                continue;
            };
            if to >= floor {
                let how = if to == floor {
                    "beside it, on the same floor"
                } else {
                    "above it"
                };
                problems.push(format!(
                    "{}/{rel}:{}: `{layer}` (floor {floor}) imports `{}` from `{}` (floor {to}), {how}",
                    table.dir,
                    r.line,
                    r.written,
                    table.cells.get(&target).map_or(target.as_str(), String::as_str),
                ));
            }
        }
    }
    problems
}

/// Every `.rs` file under `dir`, as (path relative to `dir`, text).
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {}: {e}", d.display()));
        for entry in entries {
            let p: PathBuf = entry.expect("a directory entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(dir).expect("under its dir");
                let rel = rel.to_string_lossy().replace('\\', "/");
                let text = fs::read_to_string(&p)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
                out.push((rel, text));
            }
        }
    }
    out.sort();
    out
}

/// The table against the tree (a row per top-level module, a module per
/// row), then the imports against the table.
fn check_tree(root: &Path, table: &Table) -> Vec<String> {
    let dir = root.join(&table.dir);
    let mut problems = Vec::new();
    let mut tops = BTreeMap::new();
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let p = entry.expect("a directory entry").path();
        let name = p
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if p.is_dir() {
            tops.insert(name.clone(), format!("{name}/"));
        } else if let Some(stem) = name.strip_suffix(".rs") {
            tops.entry(stem.to_string()).or_insert(name.clone());
        }
    }
    for (name, shown) in &tops {
        if !table.floors.contains_key(name) {
            problems.push(format!(
                "{}/{shown}: no row in the table of {DOC}",
                table.dir
            ));
        }
    }
    for (name, cell) in &table.cells {
        match tops.get(name) {
            None => problems.push(format!(
                "{DOC}: row `{cell}`: no such module in {}",
                table.dir
            )),
            Some(shown) if shown != cell => problems.push(format!(
                "{DOC}: row `{cell}`: {}/ holds it as `{shown}`",
                table.dir
            )),
            Some(_) => {}
        }
    }
    problems.extend(check_sources(table, &sources(&dir)));
    problems
}

#[test]
fn every_layer_table_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace");
    let doc = fs::read_to_string(root.join(DOC)).expect("ARCHITECTURE.md at the workspace root");
    let tables = layer_tables(&doc).unwrap_or_else(|e| panic!("{e}"));
    for dir in REQUIRED {
        assert!(
            tables.iter().any(|t| t.dir == *dir),
            "{DOC} has no \"{HEADING}{dir}\" table"
        );
    }
    let mut report = String::new();
    for table in &tables {
        let problems = check_tree(root, table);
        if !problems.is_empty() {
            let _ = writeln!(report, "{}: {} problem(s)", table.dir, problems.len());
            for p in problems {
                let _ = writeln!(report, "  {p}");
            }
        }
    }
    assert!(
        report.is_empty(),
        "imports that break the layers of {DOC} (a layer may import only lower floors; \
         move what is shared down, or change the table):\n{report}"
    );
}

/// The checker on a small crate in memory.
mod checker {
    use super::*;

    const EXAMPLE: &str = "\
# Example

## Layers of demo/src

Some words before the table.

| floor | module | owns |
|---|---|---|
| 1 | `error.rs` | errors |
| 2 | `conn/` | connections |
| 2 | `config.rs` | settings, beside conn |
| 3 | `upstream/` | the router |
| 4 | `lib.rs` | the crate root |
";

    fn table() -> Table {
        let mut tables = layer_tables(EXAMPLE).expect("the example parses");
        assert_eq!(tables.len(), 1);
        tables.remove(0)
    }

    fn check(rel: &str, src: &str) -> Vec<String> {
        check_sources(&table(), &[(rel.to_string(), src.to_string())])
    }

    #[test]
    fn reads_the_table_bottom_to_top() {
        let t = table();
        assert_eq!(t.dir, "demo/src");
        assert_eq!(t.floors.get("error"), Some(&1));
        assert_eq!(t.floors.get("conn"), Some(&2));
        assert_eq!(t.floors.get("lib"), Some(&4));
        assert!(layer_tables("## Layers of x/src\n\n| f | m | o |\n|-|-|-|\n| 2 | `a.rs` | a |\n| 1 | `b.rs` | b |\n").is_err());
    }

    #[test]
    fn downward_imports_pass() {
        assert!(check(
            "upstream/submit.rs",
            "use crate::conn::mux::MuxConn;\nuse crate::error::Result;"
        )
        .is_empty());
        assert!(check(
            "conn/mux.rs",
            "use crate::error::Error; use super::node::Node;"
        )
        .is_empty());
        assert!(check(
            "lib.rs",
            "pub use upstream::Upstream; pub use crate::upstream::X;"
        )
        .is_empty());
    }

    #[test]
    fn an_upward_import_fails() {
        let problems = check(
            "conn/node.rs",
            "//! A node.\n\nuse crate::upstream::Upstream;\n",
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            problems[0],
            "demo/src/conn/node.rs:3: `conn` (floor 2) imports `crate::upstream::Upstream` from `upstream/` (floor 3), above it"
        );
    }

    #[test]
    fn inline_paths_and_groups_count() {
        let src = "fn f() -> crate::upstream::Hold { todo() }\nuse crate::{error::Error, upstream::{A, B}};";
        let problems = check("conn/mux.rs", src);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains(":1: ") && problems[0].contains("`crate::upstream::Hold`"));
        assert!(problems[1].contains(":2: ") && problems[1].contains("`crate::upstream`"));
    }

    #[test]
    fn a_layer_beside_counts_too() {
        let problems = check("conn/mux.rs", "use crate::config::Session;");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].ends_with("beside it, on the same floor"));
    }

    #[test]
    fn root_items_are_the_crate_roots() {
        let problems = check("upstream/replay.rs", "use crate::{Session, Upstream};");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("from `lib.rs` (floor 4)"));
    }

    #[test]
    fn super_that_climbs_to_the_root_counts() {
        // From `conn.rs`'s own tests module, `super` is `conn`: fine.
        assert!(check(
            "conn.rs",
            "mod tests {\n    use super::*;\n    use super::node::Node;\n}"
        )
        .is_empty());
        let problems = check("conn.rs", "use super::upstream::Upstream;");
        assert_eq!(problems.len(), 1, "{problems:?}");
        let problems = check("conn/node.rs", "fn f() { super::super::upstream::go() }");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("`super::super::upstream::go`"));
    }

    #[test]
    fn comments_and_literals_do_not_count() {
        let src = r##"
//! See [`crate::upstream`].
/// Or `crate::upstream::Upstream`.
/* crate::upstream /* nested */ crate::upstream */
const A: &str = "crate::upstream::X";
const B: &str = r#"crate::upstream "quoted" crate::upstream"#;
const C: char = '"';
fn f<'a>(x: &'a str) -> &'a str { x }
pub(crate) fn g() {}
macro_rules! m { () => { $crate::upstream::X } }
"##;
        assert_eq!(check("conn/node.rs", src), Vec::<String>::new());
    }

    #[test]
    fn a_module_without_a_row_is_named() {
        let problems = check("extra/thing.rs", "");
        assert_eq!(
            problems,
            vec!["demo/src/extra/thing.rs: module `extra` has no row in the table"]
        );
    }
}
