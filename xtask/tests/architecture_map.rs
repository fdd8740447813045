//! `docs/ARCHITECTURE.md`'s map names every source file of every package, and names no file
//! that is gone: a newcomer reads the map, so a file the map does not name is a file nobody
//! will find, and a name the map keeps after a move sends them to nothing.
//!
//! The map has one section per package, headed `### `<package dir>/``; inside it, every
//! source file is named by its path relative to the package's `src/`, in backticks (a
//! module folder's `mod.rs` as `folder/mod.rs`). Unit-test files (`tests.rs`) are not named.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The packages the map covers, as folders of the repository.
const PACKAGES: &[&str] = &[
    "ailb-common",
    "ailb-ebpf",
    "ailb-userspace",
    "xtask",
    "tests/integration",
    "tests/sim",
    "tests/tools",
    "tests/fuzz",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repository").to_path_buf()
}

/// Every `.rs` file under `dir`, relative to it, test files left out.
fn sources(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
                let rel = path.strip_prefix(base).expect("under its base").to_string_lossy().into_owned();
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The map's section for `package`: from its `### `package/`` heading to the next heading.
fn section<'a>(doc: &'a str, package: &str) -> &'a str {
    let heading = format!("### `{package}/`");
    let start = doc.find(&heading).unwrap_or_else(|| panic!("docs/ARCHITECTURE.md has no section {heading}"));
    let body = &doc[start + heading.len()..];
    let end = body.find("\n#").unwrap_or(body.len());
    &body[..end]
}

/// Every backticked `*.rs` path in `text`.
fn named(text: &str) -> BTreeSet<String> {
    text.split('`').skip(1).step_by(2).filter(|s| s.ends_with(".rs") && !s.contains(' ')).map(str::to_string).collect()
}

#[test]
fn the_map_names_every_source_file_and_no_file_that_is_gone() {
    let root = repo();
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let mut problems = Vec::new();
    for package in PACKAGES {
        let text = section(&doc, package);
        let names = named(text);
        let mut files = BTreeSet::new();
        // `tests/fuzz` keeps its targets in fuzz_targets/ beside src/.
        for sub in ["src", "fuzz_targets"] {
            let dir = root.join(package).join(sub);
            if dir.is_dir() {
                files.extend(sources(&dir).into_iter().map(|f| if sub == "src" { f } else { format!("{sub}/{f}") }));
            }
        }
        assert!(!files.is_empty(), "{package} has no source files: is the list of packages stale?");
        for f in files.difference(&names) {
            problems.push(format!("{package}/src/{f} is not named in the map's section `{package}/`"));
        }
        for f in names.difference(&files) {
            problems.push(format!("the map's section `{package}/` names {f}, which {package} does not have"));
        }
    }
    assert!(problems.is_empty(), "docs/ARCHITECTURE.md's map is out of date:\n{}", problems.join("\n"));
}
