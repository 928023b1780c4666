//! `docs/lifecycle.md` stays true: every rule id (`L11`) cited in the code or tests is a
//! rule there, every rule there has a test that cites it (in its name or doc comment), and
//! every file and test the document names exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `crates/`, with its text.
fn sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![repo().join("crates")];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_dir() && e.file_name() != "target" {
                todo.push(p);
            } else if t.is_file() && p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(repo()).unwrap().display().to_string();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The rule ids in `text`, as words: the seed's, `L` then one or two digits and an
/// optional `a`; Trainyard's own, `TY` then one or two digits.
fn ids(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = BTreeSet::new();
    for i in 0..b.len() {
        if i > 0 && word(b[i - 1]) {
            continue;
        }
        if b[i..].starts_with(b"TY") {
            let digits = b[i + 2..].iter().take_while(|c| c.is_ascii_digit()).count();
            if (1..=2).contains(&digits) && !b.get(i + 2 + digits).is_some_and(|c| word(*c)) {
                out.insert(text[i..i + 2 + digits].to_string());
            }
            continue;
        }
        if b[i] != b'L' {
            continue;
        }
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if !(1..=2).contains(&digits) {
            continue;
        }
        let mut end = i + 1 + digits;
        if b.get(end) == Some(&b'a') && !b.get(end + 1).is_some_and(|c| word(*c)) {
            end += 1;
        }
        if b.get(end).is_some_and(|c| word(*c)) {
            continue;
        }
        out.insert(text[i..end].to_string());
    }
    out
}

/// Test functions (`#[test]` or inside `proptest!`) and the rule ids each cites: in its
/// name (`l11_...`, `..._l12a_...`) or its doc comment.
fn tests_citing(sources: &[(String, String)]) -> (BTreeMap<String, BTreeSet<String>>, BTreeSet<String>) {
    let mut by_rule: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut fns = BTreeSet::new();
    for (_, text) in sources {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(rest) = t.strip_prefix("fn ").or_else(|| t.strip_prefix("pub fn ")).or_else(|| t.strip_prefix("async fn ")) else {
                continue;
            };
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            fns.insert(name.clone());
            let above = &lines[i.saturating_sub(12)..i];
            if !above.iter().any(|l| l.contains("#[test]") || l.contains("proptest!")) {
                continue;
            }
            let mut cited = BTreeSet::new();
            for part in name.split('_') {
                cited.extend(ids(&part.to_uppercase().replace('A', "a")));
            }
            let mut j = i;
            while j > 0 && (lines[j - 1].trim_start().starts_with("///") || lines[j - 1].trim_start().starts_with("#[")) {
                j -= 1;
                cited.extend(ids(lines[j]));
            }
            for id in cited {
                by_rule.entry(id).or_default().insert(name.clone());
            }
        }
    }
    (by_rule, fns)
}

fn doc() -> String {
    std::fs::read_to_string(repo().join("docs/lifecycle.md")).expect("docs/lifecycle.md")
}

/// The rules the document defines (`### L11. ...`).
fn rules(doc: &str) -> BTreeSet<String> {
    doc.lines().filter_map(|l| l.strip_prefix("### ")).filter_map(|l| l.split_once('.')).map(|(id, _)| id.to_string()).collect()
}

#[test]
fn every_rule_cited_in_code_or_tests_is_in_the_lifecycle_document() {
    let defined = rules(&doc());
    assert!(defined.len() >= 24, "{defined:?}");
    let mut unknown = Vec::new();
    for (path, text) in sources() {
        for id in ids(&text) {
            if !defined.contains(&id) {
                unknown.push(format!("{path}: {id}"));
            }
        }
    }
    assert!(unknown.is_empty(), "rules cited but not in docs/lifecycle.md: {unknown:?}");
}

#[test]
fn every_rule_in_the_lifecycle_document_has_a_test() {
    let (by_rule, _) = tests_citing(&sources());
    let missing: Vec<String> = rules(&doc()).into_iter().filter(|r| !by_rule.contains_key(r)).collect();
    assert!(missing.is_empty(), "rules with no test citing them: {missing:?}");
}

#[test]
fn the_files_and_tests_the_lifecycle_document_names_exist() {
    let doc = doc();
    let (by_rule, fns) = tests_citing(&sources());
    let mut current = String::new();
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            current = h.split_once('.').map(|(id, _)| id.to_string()).unwrap_or_default();
        }
        let quoted = line.split('`').skip(1).step_by(2);
        if line.starts_with("- Code:") {
            for path in quoted {
                assert!(repo().join(path).is_file(), "{current}: {path} does not exist");
            }
        } else if line.starts_with("- Tests:") {
            for name in quoted {
                assert!(fns.contains(name), "{current}: no test named {name}");
                assert!(by_rule.get(&current).is_some_and(|t| t.contains(name)), "{current}: {name} does not cite {current}");
            }
        }
    }
}

#[test]
fn rule_ids_are_found_as_words_only() {
    assert_eq!(ids("L11, L12a and (L3); not XL5, L123, L7x or L12ab"), ["L11", "L12a", "L3"].map(String::from).into());
    assert_eq!(ids("TY4 and (TY9); not TY, TY123, TY4a, XTY5 or TYPE"), ["TY4", "TY9"].map(String::from).into());
}
