//! The house's arrows: no module imports one that imports it back, directly or around a
//! longer circle, so each can be read and changed from the bottom up (config and the
//! shared words at the bottom, then upstream, placement and validation, then the pipeline,
//! then the front-ends and listeners). `lib.rs` (the `Gateway` every layer is handed) is
//! the one exception left. And the pipeline and the rules it calls name no wire crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/`.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Each top-level module of `src/` and the top-level modules its code (not its tests or
/// comments) names through `crate::`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = src();
    let files = sources(&src);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative.iter().next().unwrap().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_string();
        if ["lib", "main", "architecture_tests"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        let named = graph.entry(module.clone()).or_default();
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for (at, _) in code.match_indices("crate::") {
            for name in top_names(&code[at + "crate::".len()..]) {
                if name != module {
                    named.insert(name);
                }
            }
        }
    }
    graph
}

/// The top-level modules named right after a `crate::`: one (`crate::a::b`), or each of a
/// group (`crate::{a, b::c}`); a name that is not a module (`crate::SomeType`) is left out.
fn top_names(rest: &str) -> Vec<String> {
    let module_name = |text: &str| -> Option<String> {
        let name: String = text
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    };
    let Some(group) = rest.strip_prefix('{') else {
        return module_name(rest).into_iter().collect();
    };
    // The group's items at its own depth: `a::{b, c}` is one item, `a`.
    let (mut names, mut depth, mut item) = (Vec::new(), 0, 0);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.extend(module_name(&group[item..at]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.extend(module_name(&group[item..at]));
                item = at + 1;
            }
            _ => {}
        }
    }
    names
}

/// The modules `from` reaches by following imports.
fn reach(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(module) = todo.pop() {
        for next in graph.get(&module).into_iter().flatten() {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    assert!(graph.len() > 15, "{graph:?}");
    let circles: Vec<String> = graph
        .keys()
        .filter(|module| reach(&graph, module).contains(*module))
        .map(|module| {
            let back: Vec<&String> = graph[module]
                .iter()
                .filter(|next| reach(&graph, next).contains(module))
                .collect();
            format!("{module} -> {back:?} -> {module}")
        })
        .collect();
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

/// The pipeline, the services and what they call know no wire format: axum and tonic
/// belong to the front-ends (`src/frontend`), so a rule written there holds for HTTP and
/// gRPC alike.
#[test]
fn protocol_neutral_modules_name_no_wire_crate() {
    let files: Vec<PathBuf> = [
        "pipeline",
        "services",
        "validate",
        "placement",
        "routing",
        "auth",
        "openai",
    ]
    .iter()
    .flat_map(|dir| sources(&src().join(dir)))
    .collect();
    assert!(files.len() > 20, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for crate_name in ["axum", "tonic"] {
            assert!(
                !text.contains(&format!("{crate_name}::")),
                "{} names {crate_name}",
                file.display()
            );
        }
    }
}
