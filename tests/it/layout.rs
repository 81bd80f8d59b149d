//! The shape of the code: in each crate (`src/`, and the data plane's
//! `dataplane/src/`) the top-level modules depend on each other without
//! cycles, so that data flows one way (CSI call -> custom resource ->
//! controller -> instance manager -> engine -> replicas) and each module can
//! be read knowing only those below it; the CSI services reach the
//! controllers only through the custom resources; and the data plane knows
//! nothing of Kubernetes, which its crate's dependencies make a compile-time
//! fact.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// The product code of a file: test modules and test helpers are left out.
fn product_code(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if name == "tests.rs" || name.ends_with("_tests.rs") || name == "testutil.rs" {
        return None;
    }
    if path.components().any(|c| c.as_os_str() == "tests") {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.split("#[cfg(test)]").next()?.to_string())
}

/// The top-level modules named in `crate::` paths of `code`, grouped
/// `use crate::{a::x, b}` imports included.
fn crate_paths(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .collect(),
            None => vec![rest],
        };
        for name in names {
            let name: String = name
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&name) {
                found.insert(name);
            }
        }
    }
    found
}

/// Which top-level module of the crate whose sources are in `dir` (relative
/// to the workspace root) uses which.
fn dependencies(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let module_of = |path: &Path| -> Option<String> {
        let first = path.strip_prefix(&src).ok()?.components().next()?;
        let name = first.as_os_str().to_str()?;
        Some(name.trim_end_matches(".rs").to_string())
    };
    let files = sources(&src);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(f))
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let (Some(module), Some(code)) = (module_of(file), product_code(file)) else {
            continue;
        };
        if !modules.contains(&module) {
            continue;
        }
        let uses = crate_paths(&code, &modules);
        graph
            .entry(module.clone())
            .or_default()
            .extend(uses.into_iter().filter(|m| *m != module));
    }
    graph
}

/// A cycle through `start`, if there is one.
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let last = path.last().cloned().unwrap_or_default();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(graph, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

/// Panics with the cycle if `graph` has one.
fn assert_acyclic(graph: &BTreeMap<String, BTreeSet<String>>) {
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(graph, module) {
            panic!("import cycle: {}\n{graph:#?}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_modules_of_src_depend_on_each_other_without_cycles() {
    let graph = dependencies("src");
    assert!(
        graph.contains_key("csi") && graph.contains_key("controller"),
        "{graph:?}"
    );
    assert_acyclic(&graph);
}

#[test]
fn the_modules_of_the_data_plane_depend_on_each_other_without_cycles() {
    let graph = dependencies("dataplane/src");
    assert!(
        graph.contains_key("engine") && graph.contains_key("replica"),
        "{graph:?}"
    );
    assert_acyclic(&graph);
}

#[test]
fn the_data_plane_crate_depends_on_nothing_of_kubernetes_or_object_stores() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dataplane/Cargo.toml"))
            .unwrap();
    let dependencies: Vec<&str> = manifest
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim()))
        .collect();
    for banned in [
        "kube",
        "k8s-openapi",
        "object_store",
        "reqwest",
        "hyper",
        "oxhorn",
    ] {
        assert!(
            !dependencies.contains(&banned),
            "dataplane/Cargo.toml depends on {banned}"
        );
    }
}

#[test]
fn the_csi_services_reach_the_controllers_only_through_the_resources() {
    let graph = dependencies("src");
    let csi = &graph["csi"];
    assert!(
        !csi.contains("controller"),
        "csi imports controller: {csi:?}"
    );
}

#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycle_from(&graph, "a").unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(cycle_from(&graph, "d"), None);
}
