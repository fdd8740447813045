//! The arrows between modules point one way: no cycle among the modules of any directory, in
//! this crate (`src/`: the top-level modules, and the children of every module folder) and in
//! the eBPF crate (`ailb-ebpf/src`, one node per file).
//!
//! Each source file is read as text: comments, strings and character literals are blanked,
//! and so is every item under `#[cfg(test)]` (a test reaches wherever its fixtures are); files
//! named `tests.rs` or `*_tests.rs`, files under a `tests/` folder and modules declared
//! `#[cfg(test)] mod name;` are left out for the same reason. Every path that starts with
//! `crate::` or `super::` (in `use` items, grouped `{a::{b, c as d}}` included, and in
//! expressions) is resolved to the deepest module that a file defines, so an item re-exported
//! by a parent counts as the parent's. Then, for each directory, its children (a file or a
//! folder, one node each) must form no cycle; the directory's own `mod.rs` (or the crate root)
//! is not a node, since a parent that re-exports its children and children that use the
//! parent's shared items are one module.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

/// Cycles that are known and accepted for now, by directory (`""`: the crate root): each
/// entry's modules must be exactly one cycle (a strongly connected component) of that
/// directory. An entry whose cycle is gone fails too, so that it is removed with the cycle.
/// None today.
const KNOWN_CYCLES: &[KnownCycle] = &[];

struct KnownCycle {
    /// `src` (this crate) or `ebpf` (`ailb-ebpf/src`).
    crate_dir: &'static str,
    dir: &'static str,
    modules: &'static [&'static str],
    reason: &'static str,
}

/// One source tree: its files by module path (`a/b.rs` and `a/b/mod.rs` are `["a", "b"]`).
struct Tree {
    name: &'static str,
    root: PathBuf,
    /// Cleaned text of every non-test file, by module path.
    files: BTreeMap<Vec<String>, Source>,
    /// Every module a file defines (test files included: they may be named, not followed).
    modules: BTreeSet<Vec<String>>,
}

struct Source {
    rel: String,
    text: String,
}

/// An arrow between two modules and one place that draws it.
#[derive(Clone)]
struct Evidence {
    file: String,
    path: String,
}

fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs") || rel.components().any(|c| c.as_os_str() == "tests")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())).path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

impl Tree {
    /// Reads `root`; `crate_root` is the file whose module is the crate (`lib.rs`, or
    /// `main.rs` for the eBPF binary); `skip` names files of another crate (a binary's
    /// `main.rs` beside `lib.rs`).
    fn read(name: &'static str, root: PathBuf, crate_root: &str, skip: &[&str]) -> Tree {
        let mut paths = Vec::new();
        rust_files(&root, &mut paths);
        let mut raw = BTreeMap::new();
        let mut modules = BTreeSet::new();
        let mut test_modules = BTreeSet::new();
        for path in paths {
            let rel = path.strip_prefix(&root).expect("under the root").to_path_buf();
            let rel_str = rel.to_string_lossy().replace('\\', "/");
            if skip.contains(&rel_str.as_str()) {
                continue;
            }
            let mut module: Vec<String> =
                rel.with_extension("").components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if rel_str == crate_root || module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            modules.insert(module.clone());
            if is_test_file(&rel) {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let (text, test_children) = strip_test_items(&blank_comments_and_literals(&text));
            for child in test_children {
                let mut m = module.clone();
                m.push(child);
                test_modules.insert(m);
            }
            raw.insert(module, Source { rel: rel_str, text });
        }
        let files =
            raw.into_iter().filter(|(m, _)| !test_modules.iter().any(|t| m.starts_with(t))).collect::<BTreeMap<_, _>>();
        Tree { name, root, files, modules }
    }

    /// The deepest module a file defines that `path` starts with.
    fn resolve(&self, path: &[String]) -> Vec<String> {
        (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| self.modules.contains(p)).unwrap_or_default()
    }

    /// Every arrow between modules: (from, to) -> where it is drawn.
    fn arrows(&self) -> BTreeMap<(Vec<String>, Vec<String>), Evidence> {
        let mut arrows = BTreeMap::new();
        for (module, src) in &self.files {
            let parent = if module.is_empty() { Vec::new() } else { module[..module.len() - 1].to_vec() };
            for (path, shown) in crate_paths(&src.text, &parent) {
                let to = self.resolve(&path);
                if &to != module {
                    arrows
                        .entry((module.clone(), to))
                        .or_insert_with(|| Evidence { file: src.rel.clone(), path: shown });
                }
            }
        }
        arrows
    }

    /// Every folder that holds modules (the root included), as module paths.
    fn directories(&self) -> BTreeSet<Vec<String>> {
        self.modules.iter().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect()
    }
}

/// The graph of a directory's children: an arrow `a -> b` when a module under child `a` uses
/// one under child `b`.
fn child_graph(
    dir: &[String],
    arrows: &BTreeMap<(Vec<String>, Vec<String>), Evidence>,
) -> BTreeMap<String, BTreeMap<String, Evidence>> {
    let child = |m: &Vec<String>| (m.len() > dir.len() && m.starts_with(dir)).then(|| m[dir.len()].clone());
    let mut graph: BTreeMap<String, BTreeMap<String, Evidence>> = BTreeMap::new();
    for ((from, to), ev) in arrows {
        if let (Some(a), Some(b)) = (child(from), child(to)) {
            if a != b {
                graph.entry(a).or_default().entry(b).or_insert_with(|| ev.clone());
            }
        }
    }
    graph
}

/// Strongly connected components of more than one node (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeMap<String, Evidence>>) -> Vec<BTreeSet<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, Evidence>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let l = s.low[w.as_str()].min(s.low[v]);
                s.low.insert(v, l);
            } else if s.on_stack.contains(w.as_str()) {
                let l = s.index[w.as_str()].min(s.low[v]);
                s.low.insert(v, l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The modules of `component` and every arrow between them, each with a place that draws it.
fn describe(component: &BTreeSet<String>, graph: &BTreeMap<String, BTreeMap<String, Evidence>>) -> String {
    let mut text = format!("{{{}}}:", component.iter().cloned().collect::<Vec<_>>().join(", "));
    for from in component {
        for (to, ev) in graph.get(from).into_iter().flatten() {
            if component.contains(to) {
                let _ = write!(text, "\n      {from} -> {to}  ({}: {})", ev.file, ev.path);
            }
        }
    }
    text
}

/// Checks every directory of `tree`; returns the failures.
fn check(tree: &Tree) -> Vec<String> {
    let arrows = tree.arrows();
    let mut failures = Vec::new();
    let mut seen_known = BTreeSet::new();
    // (directory, module) of every cycle that is not a known one.
    let mut larger = BTreeSet::new();
    for dir in tree.directories() {
        let graph = child_graph(&dir, &arrows);
        let shown = if dir.is_empty() { "the crate root".to_string() } else { format!("{}/", dir.join("/")) };
        for component in cycles(&graph) {
            let known = KNOWN_CYCLES.iter().position(|k| {
                k.crate_dir == tree.name
                    && k.dir == dir.join("/")
                    && k.modules.iter().map(|m| m.to_string()).collect::<BTreeSet<_>>() == component
            });
            match known {
                Some(i) => {
                    seen_known.insert(i);
                }
                None => {
                    larger.extend(component.iter().map(|m| (dir.join("/"), m.clone())));
                    failures.push(format!(
                        "{}: a cycle among the modules of {shown} {}",
                        tree.root.display(),
                        describe(&component, &graph)
                    ))
                }
            }
        }
    }
    for (i, k) in KNOWN_CYCLES.iter().enumerate() {
        // A known cycle inside a larger one is reported with the larger one, above.
        let inside_larger = k.modules.iter().all(|m| larger.contains(&(k.dir.to_string(), m.to_string())));
        if k.crate_dir == tree.name && !seen_known.contains(&i) && !inside_larger {
            failures.push(format!(
                "{}: the known cycle {:?} in {:?} ({}) is no longer there: remove it from KNOWN_CYCLES",
                tree.root.display(),
                k.modules,
                k.dir,
                k.reason
            ));
        }
    }
    failures
}

fn userspace() -> Tree {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // `main.rs` is the binary's crate: its `crate::` is not the library's.
    Tree::read("src", manifest.join("src"), "lib.rs", &["main.rs"])
}

fn ebpf() -> Tree {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    Tree::read("ebpf", manifest.join("../ailb-ebpf/src"), "main.rs", &[])
}

#[test]
fn no_module_cycles_in_the_userspace_crate() {
    let failures = check(&userspace());
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

#[test]
fn no_file_cycles_in_the_ebpf_crate() {
    let failures = check(&ebpf());
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

/// The reader itself: grouped and renamed imports, `super::super`, paths in expressions, and
/// what it must not read (comments, strings, lifetimes, `#[cfg(test)]` items).
#[test]
fn paths_are_read_from_use_trees_and_expressions_only() {
    let src = r##"
        use crate::{a::{b, c as d}, e::*, f::{self, G}};
        use super::super::h::I;
        use super::j;
        // use crate::commented;
        /* use crate::block /* nested */ also */
        fn f<'a>(x: &'a str) -> char {
            let _ = "crate::in_a_string";
            let _ = r#"crate::raw"#;
            let _ = crate::k::l::call(x);
            let _ = super::m::<u8>();
            'x'
        }
        macro_rules! m { () => { $crate::macro_path } }
        #[cfg(test)]
        mod tests { use crate::test_only; }
        #[cfg(test)]
        mod fake;
        #[cfg(test)]
        fn test_helper() -> [u8; 2] { crate::test_fn::x() }
    "##;
    let (text, test_children) = strip_test_items(&blank_comments_and_literals(src));
    assert_eq!(test_children, ["fake"]);
    let module: Vec<String> = ["p", "q", "r"].map(String::from).to_vec();
    let parent = module[..2].to_vec();
    let got: Vec<String> = crate_paths(&text, &parent).into_iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(got, ["a::b", "a::c", "e", "f", "f::G", "p::h::I", "p::q::j", "k::l::call", "p::q::m"]);
}

/// `text` with comments, string and character literals replaced by spaces (newlines kept).
fn blank_comments_and_literals(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(s.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let mut i = 0;
    while i < s.len() {
        let next = s.get(i + 1).copied();
        if s[i] == '/' && next == Some('/') {
            let end = s[i..].iter().position(|&c| c == '\n').map_or(s.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if s[i] == 'r' && raw_string_start(&s, i) {
            // A raw string: r"...", r#"..."#.
            let hashes = s[i + 1..].iter().take_while(|&&c| c == '#').count();
            if s.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let body = i + 2 + hashes;
            let end = (body..s.len()).find(|&j| s[j..].starts_with(&close)).map_or(s.len(), |j| j + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if s[i] == '\'' {
            // A character literal ('x', '\n', '\u{..}'); otherwise a lifetime or a label.
            if next == Some('\\') {
                let end = (i + 2..s.len()).find(|&j| s[j] == '\'').map_or(s.len(), |j| j + 1);
                blank(&mut out, i, end);
                i = end;
            } else if s.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// Whether the `r` at `i` opens a raw string (`r"`, `r#"`, `br"`), not an identifier's `r`.
fn raw_string_start(s: &[char], i: usize) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let starts_word = i == 0 || !ident(s[i - 1]) || (s[i - 1] == 'b' && (i < 2 || !ident(s[i - 2])));
    starts_word && matches!(s.get(i + 1), Some('"') | Some('#'))
}

/// `text` (already without comments and literals) with every `#[cfg(test)]` item blanked,
/// and the names of the modules declared `#[cfg(test)] mod name;`.
fn strip_test_items(text: &str) -> (String, Vec<String>) {
    const ATTR: &str = "#[cfg(test)]";
    let mut s: Vec<char> = text.chars().collect();
    let mut test_children = Vec::new();
    let mut from = 0;
    loop {
        let hay: String = s[from..].iter().collect();
        let Some(at) = hay.find(ATTR) else { break };
        let start = from + hay[..at].chars().count();
        let mut j = start + ATTR.chars().count();
        // The item ends at its first `;` or at the brace that closes its first `{`, outside
        // parentheses and brackets (`-> [u8; 2]`).
        let mut depth = 0i32;
        let mut end = s.len();
        while j < s.len() {
            match s[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                '{' if depth == 0 => {
                    let mut braces = 0;
                    while j < s.len() {
                        match s[j] {
                            '{' => braces += 1,
                            '}' => {
                                braces -= 1;
                                if braces == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    end = j + 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let end = end.min(s.len());
        let item: String = s[start..end].iter().collect();
        let words: Vec<&str> =
            item[ATTR.len()..].split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
        if item.trim_end().ends_with(';') {
            if let Some(k) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words.get(k + 1) {
                    test_children.push(name.to_string());
                }
            }
        }
        for c in &mut s[start..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        from = end;
    }
    (s.into_iter().collect(), test_children)
}

/// Every `crate::` and `super::` path of `text` (a file whose `super` is `parent`), resolved
/// from the crate root, each with its text as `crate::...`.
fn crate_paths(text: &str, parent: &[String]) -> Vec<(Vec<String>, String)> {
    let s: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if !ident(s[i]) || (i > 0 && (ident(s[i - 1]) || s[i - 1] == '$' || s[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let word_end = (i..s.len()).find(|&j| !ident(s[j])).unwrap_or(s.len());
        let word: String = s[i..word_end].iter().collect();
        let base = match word.as_str() {
            "crate" => Some(Vec::new()),
            "super" => Some(parent.to_vec()),
            _ => None,
        };
        let mut p = Reader { s: &s, at: word_end, out: Vec::new() };
        match base {
            Some(base) if p.peek_str("::") => {
                p.rest(base);
                out.extend(p.out.into_iter().map(|path| {
                    let shown = std::iter::once("crate").chain(path.iter().map(String::as_str)).collect::<Vec<_>>();
                    let shown = shown.join("::");
                    (path, shown)
                }));
                i = p.at.max(word_end);
            }
            _ => i = word_end,
        }
    }
    out
}

/// A path or `use` tree, read from after its first segment.
struct Reader<'a> {
    s: &'a [char],
    at: usize,
    out: Vec<Vec<String>>,
}

impl Reader<'_> {
    fn skip_ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_whitespace() {
            self.at += 1;
        }
    }

    fn peek_str(&mut self, want: &str) -> bool {
        self.skip_ws();
        want.chars().enumerate().all(|(k, c)| self.s.get(self.at + k) == Some(&c))
    }

    fn ident(&mut self) -> String {
        self.skip_ws();
        let start = self.at;
        while self.at < self.s.len() && (self.s[self.at].is_alphanumeric() || self.s[self.at] == '_') {
            self.at += 1;
        }
        self.s[start..self.at].iter().collect()
    }

    /// After a segment: `::` and more, or the end of this path.
    fn rest(&mut self, prefix: Vec<String>) {
        if self.peek_str("::") {
            self.at += 2;
            if self.peek_str("<") {
                self.out.push(prefix);
            } else {
                self.tree(prefix);
            }
        } else {
            self.out.push(prefix);
        }
    }

    fn tree(&mut self, prefix: Vec<String>) {
        if self.peek_str("{") {
            self.at += 1;
            loop {
                if self.peek_str("}") || self.at >= self.s.len() {
                    self.at += 1;
                    return;
                }
                let before = self.at;
                self.tree(prefix.clone());
                if self.peek_str("as") {
                    self.at += 2;
                    let _ = self.ident();
                }
                if self.peek_str(",") {
                    self.at += 1;
                }
                if self.at == before {
                    self.at += 1;
                }
            }
        } else if self.peek_str("*") {
            self.at += 1;
            self.out.push(prefix);
        } else {
            let word = self.ident();
            let mut p = prefix;
            match word.as_str() {
                "" => {
                    self.out.push(p);
                    return;
                }
                "self" => {}
                // `super::super`: one more level up.
                "super" => {
                    p.pop();
                }
                _ => p.push(word),
            }
            self.rest(p);
        }
    }
}
