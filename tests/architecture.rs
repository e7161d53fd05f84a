//! The shape of the code, checked: the crates depend on each other in one direction (the
//! crate map of the facade's docs), and no crate's modules form a cycle.
//!
//! Cargo already refuses a cycle between crates; this test also refuses a crate that
//! reaches *up* the map (say the runtime using linalg), and a cycle of modules inside a
//! crate, which the compiler accepts but which leaves no order to read, test or split the
//! code in. The module graph is read from the `crate::…` paths (and, inside a directory
//! module, the `super::sibling` paths) of every source file, `use` lines and inline paths
//! alike, with names re-exported by the crate root resolved to the module that defines them.
//! Unit-test modules (`#[cfg(test)] mod … { … }`) are left out, as cargo lets
//! dev-dependencies point up: a module's tests may check it against the modules above it.
//!
//! Run alone with `cargo test --test architecture`; it needs only `cargo metadata`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crate map, bottom to top: a crate may depend on crates of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["rankwise-ucx-sys", "rankwise-testkit"],
    &["rankwise-transports"],
    &["rankwise-device"],
    &["rankwise-exec"],
    &["rankwise-sources"],
    &["rankwise-linalg"],
    &["rankwise-genomics"],
    &["rankwise-output"],
    &["rankwise"],
    &["rankwise-launch", "rankwise-capi", "rankwise-python"],
    &["rankwise-fault"],
];

struct Package {
    name: String,
    /// Workspace crates this one depends on (normal and build dependencies).
    deps: Vec<String>,
    /// Root files of its lib and bin targets.
    roots: Vec<PathBuf>,
}

fn workspace() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: BTreeSet<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap().to_string(),
            deps: p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|d| members.contains(d))
                .collect(),
            roots: p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| {
                    t["kind"].as_array().unwrap().iter().any(|k| {
                        matches!(
                            k.as_str(),
                            Some("lib" | "rlib" | "cdylib" | "staticlib" | "bin")
                        )
                    })
                })
                .map(|t| PathBuf::from(t["src_path"].as_str().unwrap()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        })
        .collect()
}

#[test]
fn crates_depend_downwards_only() {
    let layer = |name: &str| LAYERS.iter().position(|l| l.contains(&name));
    let mut wrong = Vec::new();
    for p in workspace() {
        let Some(own) = layer(&p.name) else {
            wrong.push(format!(
                "{} is missing from LAYERS in tests/architecture.rs",
                p.name
            ));
            continue;
        };
        for d in &p.deps {
            match layer(d) {
                Some(l) if l < own => {}
                _ => wrong.push(format!("{} depends on {d}, which is not below it", p.name)),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_module_cycles_in_any_crate() {
    let mut cycles = Vec::new();
    let mut checked = 0;
    for p in workspace() {
        for root in &p.roots {
            let graph = ModuleGraph::of_crate(root);
            checked += graph.modules.len();
            for c in graph.cycles() {
                cycles.push(format!("{} ({}): {}", p.name, root.display(), c));
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} modules found: is the scan broken?"
    );
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// The modules of one level (a crate root's, or a directory module's children) and the
/// references between them, each with one place it is made.
struct ModuleGraph {
    /// Where the level sits, for messages (`crate`, `crate::gpu`).
    level: String,
    modules: BTreeSet<String>,
    /// (from, to) → a `file:line` where `from` names `to`.
    edges: BTreeMap<(String, String), String>,
    /// The levels below: directory modules' children.
    children: Vec<ModuleGraph>,
}

impl ModuleGraph {
    fn of_crate(root: &Path) -> Self {
        Self::of_level(root, root.parent().unwrap(), "crate".into(), true)
    }

    /// `parent_file` declares the modules; their files live in `dir`.
    fn of_level(parent_file: &Path, dir: &Path, level: String, top: bool) -> Self {
        let parent_src = code_only(&std::fs::read_to_string(parent_file).unwrap());
        let modules = declared_modules(&parent_src);
        // Names the level's parent re-exports (`pub use m::{A, B}`) stand for module m.
        let reexports = reexported_names(&parent_src, &modules);
        let mut g = ModuleGraph {
            level: level.clone(),
            modules: modules.clone(),
            edges: BTreeMap::new(),
            children: Vec::new(),
        };
        for m in &modules {
            let (file, sub_dir) = if dir.join(format!("{m}.rs")).exists() {
                (dir.join(format!("{m}.rs")), dir.join(m))
            } else if dir.join(m).join("mod.rs").exists() {
                (dir.join(m).join("mod.rs"), dir.join(m))
            } else {
                continue; // inline module (e.g. `mod tests { … }`)
            };
            for f in rust_files(&file, &sub_dir) {
                let text = without_test_modules(&code_only(&std::fs::read_to_string(&f).unwrap()));
                let own_file = f == file;
                for (line, name) in referenced(&text, top, own_file, &level) {
                    let target = if modules.contains(&name) {
                        name
                    } else if let Some(t) = reexports.get(&name) {
                        t.clone()
                    } else {
                        continue;
                    };
                    if &target != m {
                        g.edges
                            .entry((m.clone(), target))
                            .or_insert_with(|| format!("{}:{line}", f.display()));
                    }
                }
            }
            if sub_dir.is_dir() {
                let child_level = format!("{level}::{m}");
                let child = Self::of_level(&file, &sub_dir, child_level, false);
                if !child.modules.is_empty() {
                    g.children.push(child);
                }
            }
        }
        g
    }

    /// Every cycle (strongly connected set of more than one module) of this level and the
    /// levels below, each with the references that close it.
    fn cycles(&self) -> Vec<String> {
        let mut out = Vec::new();
        for scc in strongly_connected(&self.modules, &self.edges) {
            let refs: Vec<String> = self
                .edges
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .map(|((a, b), at)| format!("    {a} → {b} ({at})"))
                .collect();
            out.push(format!(
                "{} modules {:?}\n{}",
                self.level,
                scc,
                refs.join("\n")
            ));
        }
        for c in &self.children {
            out.extend(c.cycles());
        }
        out
    }
}

/// The module's own file and every file below its directory.
fn rust_files(file: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![file.to_path_buf()];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && p != file {
                out.push(p);
            }
        }
    }
    out
}

/// The source without comments (doc comments name paths that are not uses) and without
/// the contents of string literals. Line breaks are kept so that line numbers hold.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            // Raw strings (r"…", r#"…"#) are rare in our sources and hold no quotes that
            // would confuse this; plain strings skip escapes.
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                } else if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The source with the bodies of `#[cfg(test)] mod name { … }` blanked (line breaks kept).
fn without_test_modules(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let tail = after["#[cfg(test)]".len()..].trim_start();
        let tail = tail.strip_prefix("pub(crate) ").unwrap_or(tail);
        let is_module = tail.starts_with("mod ")
            && tail
                .find(['{', ';'])
                .is_some_and(|i| tail.as_bytes()[i] == b'{');
        if !is_module {
            out.push_str("#[cfg(test)]");
            rest = &after["#[cfg(test)]".len()..];
            continue;
        }
        let open = after.find('{').unwrap();
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.extend(after[..end].chars().filter(|&c| c == '\n'));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Modules declared by `mod name;` or `mod name {` at the top of a file (any visibility).
fn declared_modules(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in src.lines() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub(super) "))
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        if let Some(rest) = t.strip_prefix("mod ") {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            // Only modules of the top level of the file: an indented `mod` is nested.
            if !name.is_empty() && line.len() - line.trim_start().len() == 0 {
                out.insert(name);
            }
        }
    }
    out
}

/// `pub use m::{A, b::C}` and `pub use m::A` in a parent file: A, C → m.
fn reexported_names(src: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + 8..];
        let stmt = &rest[..rest.find(';').unwrap_or(rest.len())];
        let stmt = stmt.trim().trim_start_matches("self::");
        let first: String = stmt.chars().take_while(|&c| is_ident(c)).collect();
        if !modules.contains(&first) {
            continue;
        }
        for name in stmt
            .split(|c: char| !is_ident(c))
            .filter(|w| !w.is_empty() && *w != "self" && *w != "as")
        {
            out.entry(name.to_string()).or_insert_with(|| first.clone());
        }
    }
    out
}

/// (line, module name) of every path that leaves a module for a sibling: `crate::x` and the
/// first names inside `crate::{x, y::z}`; below the crate root, paths through this level
/// (`crate::gpu::x` from inside `crate::gpu`) and, in the module's own file, `super::x`.
fn referenced(src: &str, top: bool, own_file: bool, level: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut prefixes = vec![if top {
        "crate::".to_string()
    } else {
        format!("{level}::")
    }];
    if !top && own_file {
        prefixes.push("super::".into());
    }
    let line_of = |pos: usize| src[..pos].matches('\n').count() + 1;
    for prefix in &prefixes {
        let mut from = 0;
        while let Some(at) = src[from..].find(prefix.as_str()) {
            let pos = from + at;
            from = pos + prefix.len();
            // A whole path segment only (not `foo_crate::`).
            if pos > 0 && src[..pos].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let after = &src[from..];
            if let Some(group) = after.strip_prefix('{') {
                // The first segment of each item of the group, at depth one.
                let mut depth = 1;
                let mut expect = true;
                let mut word = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ',' if depth == 1 => expect = true,
                        c if depth == 1 && expect && is_ident(c) => word.push(c),
                        _ => {
                            if !word.is_empty() {
                                out.push((line_of(pos), std::mem::take(&mut word)));
                                expect = false;
                            }
                        }
                    }
                }
                if !word.is_empty() {
                    out.push((line_of(pos), word));
                }
            } else {
                let name: String = after.chars().take_while(|&c| is_ident(c)).collect();
                if !name.is_empty() {
                    out.push((line_of(pos), name));
                }
            }
        }
    }
    out
}

/// Tarjan's strongly connected components with more than one member.
fn strongly_connected(
    nodes: &BTreeSet<String>,
    edges: &BTreeMap<(String, String), String>,
) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        next: usize,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
        adj: BTreeMap<&'a str, Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.adj.get(v).cloned().unwrap_or_default() {
            if !s.index.contains_key(w) {
                visit(w, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        adj.entry(a.as_str()).or_default().push(b.as_str());
    }
    let mut s = State {
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
        adj,
    };
    for n in nodes {
        if !s.index.contains_key(n.as_str()) {
            visit(n.as_str(), &mut s);
        }
    }
    s.out
}

/// The scan itself, on a made-up crate: a cycle through a `use` group and a re-export is
/// found, and comments and strings are not read as paths.
#[test]
fn the_scan_finds_a_planted_cycle() {
    let dir = std::env::temp_dir().join(format!("rankwise-arch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("d")).unwrap();
    std::fs::write(
        dir.join("lib.rs"),
        "mod a;\npub mod b;\nmod c;\nmod d;\npub use b::{Thing, other::More};\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("a.rs"),
        "use crate::{b::x, c};\n#[cfg(test)]\nmod tests {\n    use crate::d::E;\n}\n",
    )
    .unwrap();
    std::fs::write(dir.join("b.rs"), "// crate::c\nfn f() { crate::c::g() }\n").unwrap();
    std::fs::write(
        dir.join("c.rs"),
        "const S: &str = \"crate::a\";\nfn g() -> crate::Thing { todo!() }\n",
    )
    .unwrap();
    std::fs::write(dir.join("d.rs"), "mod e;\nmod f;\n").unwrap();
    std::fs::write(dir.join("d").join("e.rs"), "use super::f;\n").unwrap();
    std::fs::write(dir.join("d").join("f.rs"), "use crate::d::e::Y;\n").unwrap();
    let g = ModuleGraph::of_crate(&dir.join("lib.rs"));
    let cycles = g.cycles();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(cycles.len(), 2, "{cycles:#?}");
    assert!(cycles[0].contains(r#"{"b", "c"}"#), "{cycles:#?}");
    assert!(
        cycles[1].contains(r#"crate::d modules {"e", "f"}"#),
        "{cycles:#?}"
    );
    assert!(!g.edges.contains_key(&("c".into(), "a".into())));
    assert!(
        !g.edges.contains_key(&("a".into(), "d".into())),
        "a test module's use"
    );
}
