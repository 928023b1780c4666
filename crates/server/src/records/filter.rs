//! The list filters of Vertex ML Metadata and TensorBoard (AIP-160, the part these
//! methods take), evaluated over a record's JSON:
//!
//! - comparisons `field = value`, `!=`, `<`, `<=`, `>`, `>=`, and `field:value` (has: an
//!   element of a list, a key of a map, a string with `*` as a wildcard, or equal);
//! - `AND`, `OR` (which binds tighter, as AIP-160 has it), `NOT` or `-`, parentheses;
//! - values: "strings" (with `\` escapes), numbers, `true`/`false`, bare words;
//! - fields in snake_case or camelCase (`schema_title`, `display_name`, `create_time`,
//!   `parent_contexts`, `labels.KEY`); `metadata.KEY` and its typed forms
//!   `metadata.KEY.string_value` / `number_value` / `bool_value` (the KEY may be quoted
//!   with backquotes);
//! - functions: `in_context("CONTEXT NAME")` (an artifact or execution attributed or
//!   associated to it).
//!
//! A filter is parsed once, with a limit on its length and depth (a filter bomb is an
//! INVALID_ARGUMENT naming the limit, never a deep recursion), and errors name what is
//! wrong and where.

use serde_json::Value;

use super::camel;

/// The longest filter taken, in bytes.
pub const MAX_LEN: usize = 8 * 1024;
/// The deepest nesting of parentheses and NOTs.
pub const MAX_DEPTH: usize = 32;

/// A parsed filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    All,
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
    Compare { field: Vec<String>, op: Op, value: Literal },
    InContext(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Has,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Text(String),
    Number(f64),
    Bool(bool),
}

/// What a record offers a filter besides its JSON: the contexts it is in.
pub trait Subject {
    fn json(&self) -> &Value;
    fn in_context(&self, context: &str) -> bool;
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    LParen,
    RParen,
    Comma,
    Dot,
    Op(Op),
    Text(String),
    Word(String),
    Minus,
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'(' => (out.push(Tok::LParen), i += 1).1,
            b')' => (out.push(Tok::RParen), i += 1).1,
            b',' => (out.push(Tok::Comma), i += 1).1,
            b'.' if !b.get(i + 1).is_some_and(u8::is_ascii_digit) => (out.push(Tok::Dot), i += 1).1,
            b':' => (out.push(Tok::Op(Op::Has)), i += 1).1,
            b'=' => (out.push(Tok::Op(Op::Eq)), i += 1).1,
            b'!' if b.get(i + 1) == Some(&b'=') => (out.push(Tok::Op(Op::Ne)), i += 2).1,
            b'<' if b.get(i + 1) == Some(&b'=') => (out.push(Tok::Op(Op::Le)), i += 2).1,
            b'>' if b.get(i + 1) == Some(&b'=') => (out.push(Tok::Op(Op::Ge)), i += 2).1,
            b'<' => (out.push(Tok::Op(Op::Lt)), i += 1).1,
            b'>' => (out.push(Tok::Op(Op::Gt)), i += 1).1,
            b'-' if !b.get(i + 1).is_some_and(u8::is_ascii_digit) => (out.push(Tok::Minus), i += 1).1,
            b'"' | b'\'' | b'`' => {
                let quote = c;
                let mut text = String::new();
                let mut j = i + 1;
                let mut chars = s[j..].char_indices();
                loop {
                    let Some((k, ch)) = chars.next() else { return Err(format!("the quote at position {i} is not closed")) };
                    if ch as u32 == u32::from(quote) {
                        j += k + 1;
                        break;
                    }
                    if ch == '\\' {
                        match chars.next() {
                            Some((_, e)) => text.push(e),
                            None => return Err(format!("the quote at position {i} is not closed")),
                        }
                        continue;
                    }
                    text.push(ch);
                }
                // A backquoted name is a word (a metadata key with dots or spaces).
                out.push(if quote == b'`' { Tok::Word(text) } else { Tok::Text(text) });
                i = j;
            }
            _ => {
                let start = i;
                while i < b.len() && !matches!(b[i], b' ' | b'\t' | b'\n' | b'\r' | b'(' | b')' | b',' | b':' | b'=' | b'!' | b'<' | b'>' | b'"' | b'\'' | b'`') {
                    // A dot ends a word unless the word is a number so far.
                    if b[i] == b'.' && !s[start..i].chars().all(|ch| ch.is_ascii_digit() || ch == '-' || ch == '+') {
                        break;
                    }
                    i += 1;
                }
                if i == start {
                    return Err(format!("unexpected character {:?} at position {i}", s[i..].chars().next().unwrap_or(' ')));
                }
                out.push(Tok::Word(s[start..i].to_string()));
            }
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
    depth: usize,
}

/// Parse `text`; an empty filter keeps everything.
pub fn parse(text: &str) -> Result<Filter, String> {
    if text.len() > MAX_LEN {
        return Err(format!("the filter is {} bytes long; at most {MAX_LEN} are taken", text.len()));
    }
    let toks = lex(text)?;
    if toks.is_empty() {
        return Ok(Filter::All);
    }
    let mut p = Parser { toks, at: 0, depth: 0 };
    let f = p.and()?;
    if p.at < p.toks.len() {
        return Err(format!("unexpected {} after a complete filter", p.describe()));
    }
    Ok(f)
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn describe(&self) -> String {
        match self.peek() {
            None => "end of the filter".into(),
            Some(Tok::Word(w)) | Some(Tok::Text(w)) => format!("{w:?}"),
            Some(t) => format!("{t:?}"),
        }
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(x)) if x == w)
    }

    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("the filter nests deeper than {MAX_DEPTH} levels"));
        }
        Ok(())
    }

    // AND of ORs: OR binds tighter (AIP-160). Juxtaposition is AND.
    fn and(&mut self) -> Result<Filter, String> {
        let mut parts = vec![self.or()?];
        loop {
            if self.is_word("AND") {
                self.at += 1;
            } else if matches!(self.peek(), None | Some(Tok::RParen)) {
                break;
            }
            parts.push(self.or()?);
        }
        Ok(if parts.len() == 1 { parts.remove(0) } else { Filter::And(parts) })
    }

    fn or(&mut self) -> Result<Filter, String> {
        let mut parts = vec![self.unary()?];
        while self.is_word("OR") {
            self.at += 1;
            parts.push(self.unary()?);
        }
        Ok(if parts.len() == 1 { parts.remove(0) } else { Filter::Or(parts) })
    }

    fn unary(&mut self) -> Result<Filter, String> {
        if self.is_word("NOT") || self.peek() == Some(&Tok::Minus) {
            self.at += 1;
            self.deeper()?;
            let f = self.unary()?;
            self.depth -= 1;
            return Ok(Filter::Not(Box::new(f)));
        }
        if self.peek() == Some(&Tok::LParen) {
            self.at += 1;
            self.deeper()?;
            let f = self.and()?;
            self.depth -= 1;
            if self.peek() != Some(&Tok::RParen) {
                return Err(format!("expected \")\" but found {}", self.describe()));
            }
            self.at += 1;
            return Ok(f);
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Filter, String> {
        let mut field = Vec::new();
        loop {
            match self.toks.get(self.at).cloned() {
                Some(Tok::Word(w)) => field.push(w),
                _ => return Err(format!("expected a field name but found {}", self.describe())),
            }
            self.at += 1;
            if self.peek() == Some(&Tok::Dot) {
                self.at += 1;
                continue;
            }
            break;
        }
        if self.peek() == Some(&Tok::LParen) {
            return self.function(field);
        }
        let op = match self.peek() {
            Some(Tok::Op(op)) => *op,
            _ => return Err(format!("expected an operator (=, !=, <, <=, >, >=, :) after {} but found {}", field.join("."), self.describe())),
        };
        self.at += 1;
        let value = match self.toks.get(self.at).cloned() {
            Some(Tok::Text(t)) => Literal::Text(t),
            Some(Tok::Word(w)) if w == "true" => Literal::Bool(true),
            Some(Tok::Word(w)) if w == "false" => Literal::Bool(false),
            Some(Tok::Word(w)) => match w.parse::<f64>() {
                Ok(n) if n.is_finite() => Literal::Number(n),
                _ => Literal::Text(w),
            },
            _ => return Err(format!("expected a value after {} but found {}", field.join("."), self.describe())),
        };
        self.at += 1;
        Ok(Filter::Compare { field, op, value })
    }

    fn function(&mut self, name: Vec<String>) -> Result<Filter, String> {
        let name = name.join(".");
        self.at += 1;
        let arg = match self.toks.get(self.at).cloned() {
            Some(Tok::Text(t)) => t,
            _ => return Err(format!("{name}() takes one quoted resource name, found {}", self.describe())),
        };
        self.at += 1;
        if self.peek() != Some(&Tok::RParen) {
            return Err(format!("{name}() takes one argument; expected \")\" but found {}", self.describe()));
        }
        self.at += 1;
        match name.as_str() {
            "in_context" => Ok(Filter::InContext(arg)),
            other => Err(format!("unknown function {other}(); the filter takes in_context()")),
        }
    }
}

/// The values a field names in `v`: several when it crosses a list.
fn lookup<'a>(v: &'a Value, field: &[String]) -> Vec<&'a Value> {
    let Some((first, rest)) = field.split_first() else { return vec![v] };
    match v {
        Value::Array(items) => items.iter().flat_map(|i| lookup(i, field)).collect(),
        Value::Object(map) => {
            // The typed forms of a metadata value are the value itself.
            if matches!(first.as_str(), "string_value" | "number_value" | "bool_value" | "struct_value" | "stringValue" | "numberValue" | "boolValue" | "structValue")
                && rest.is_empty()
                && !map.contains_key(first.as_str())
            {
                return vec![v];
            }
            match map.get(first.as_str()).or_else(|| map.get(&camel(first))) {
                Some(inner) => lookup(inner, rest),
                None => Vec::new(),
            }
        }
        _ if matches!(first.as_str(), "string_value" | "number_value" | "bool_value" | "stringValue" | "numberValue" | "boolValue") && rest.is_empty() => vec![v],
        _ => Vec::new(),
    }
}

fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else { return false };
            (0..=rest.len()).filter(|i| rest.is_char_boundary(*i)).any(|i| glob(tail, &rest[i..]))
        }
    }
}

fn compare(v: &Value, op: Op, lit: &Literal) -> bool {
    use std::cmp::Ordering;
    // A list holds the value when one of its elements does (`parent_contexts:"..."`).
    if let Value::Array(items) = v {
        return items.iter().any(|i| compare(i, op, lit));
    }
    let ord: Option<Ordering> = match (v, lit) {
        (Value::String(s), Literal::Text(t)) => Some(s.as_str().cmp(t.as_str())),
        (Value::String(s), Literal::Number(n)) => s.parse::<f64>().ok().and_then(|x| x.partial_cmp(n)),
        (Value::String(s), Literal::Bool(b)) => Some(s.as_str().cmp(if *b { "true" } else { "false" })),
        (Value::Number(x), Literal::Number(n)) => x.as_f64().and_then(|x| x.partial_cmp(n)),
        (Value::Number(x), Literal::Text(t)) => t.parse::<f64>().ok().and_then(|n| x.as_f64().and_then(|x| x.partial_cmp(&n))),
        (Value::Bool(x), Literal::Bool(b)) => Some(x.cmp(b)),
        (Value::Bool(x), Literal::Text(t)) => Some(x.to_string().as_str().cmp(t.as_str())),
        _ => None,
    };
    match op {
        Op::Has => match (v, lit) {
            (Value::Object(m), Literal::Text(t)) => m.contains_key(t.as_str()),
            (Value::String(s), Literal::Text(t)) => glob(t, s),
            _ => ord == Some(Ordering::Equal),
        },
        Op::Eq => ord == Some(Ordering::Equal),
        Op::Ne => ord.is_some_and(|o| o != Ordering::Equal),
        Op::Lt => ord == Some(Ordering::Less),
        Op::Le => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
        Op::Gt => ord == Some(Ordering::Greater),
        Op::Ge => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
    }
}

impl Filter {
    /// What a store may narrow a list by before this filter looks at each record: the
    /// comparisons at its top (alone or joined by AND) of the schema title or display
    /// name with `=`, and a context by `in_context()` or `parent_contexts:`. A record the
    /// narrowing leaves out could not pass.
    pub fn narrow(&self) -> trainyard_store::records::Narrow<'_> {
        let mut n = trainyard_store::records::Narrow::default();
        let parts: &[Filter] = match self {
            Filter::And(parts) => parts,
            one => std::slice::from_ref(one),
        };
        for p in parts {
            match p {
                Filter::InContext(c) => n.context = Some(c),
                Filter::Compare { field, op, value: Literal::Text(t) } if field.len() == 1 => match (field[0].as_str(), op) {
                    ("schema_title" | "schemaTitle", Op::Eq) => n.schema_title = Some(t),
                    ("display_name" | "displayName", Op::Eq) => n.display_name = Some(t),
                    ("parent_contexts" | "parentContexts", Op::Has | Op::Eq) if !t.contains('*') => n.context = Some(t),
                    _ => {}
                },
                _ => {}
            }
        }
        n
    }

    /// Does `subject` pass?
    pub fn matches(&self, subject: &dyn Subject) -> bool {
        match self {
            Filter::All => true,
            Filter::And(parts) => parts.iter().all(|p| p.matches(subject)),
            Filter::Or(parts) => parts.iter().any(|p| p.matches(subject)),
            Filter::Not(inner) => !inner.matches(subject),
            Filter::InContext(name) => subject.in_context(name),
            Filter::Compare { field, op, value } => {
                let found = lookup(subject.json(), field);
                match op {
                    // `!=` holds when no value equals it (a field that is not set included).
                    Op::Ne => !found.iter().any(|v| compare(v, Op::Eq, value)),
                    _ => found.iter().any(|v| compare(v, *op, value)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct S(Value, Vec<&'static str>);
    impl Subject for S {
        fn json(&self) -> &Value {
            &self.0
        }
        fn in_context(&self, c: &str) -> bool {
            self.1.contains(&c)
        }
    }

    fn ok(filter: &str, v: &Value) -> bool {
        parse(filter).unwrap_or_else(|e| panic!("{filter}: {e}")).matches(&S(v.clone(), vec!["projects/p/locations/r/metadataStores/default/contexts/e"]))
    }

    /// The filters the SDK sends for experiments and runs select as the service does.
    #[test]
    fn the_sdks_filters() {
        let run = json!({
            "schemaTitle": "system.ExperimentRun",
            "displayName": "run-1",
            "parentContexts": ["projects/p/locations/r/metadataStores/default/contexts/e"],
            "metadata": {"state": "COMPLETE", "lr": 0.1, "deleted": false, "my key": "v"},
            "createTime": "2026-12-07T04:00:00Z",
        });
        assert!(ok(r#"schema_title="system.ExperimentRun""#, &run));
        assert!(ok(r#"schema_title="system.ExperimentRun" AND parent_contexts:"projects/p/locations/r/metadataStores/default/contexts/e""#, &run));
        assert!(!ok(r#"schema_title="system.Experiment""#, &run));
        assert!(ok(r#"schema_title="system.Experiment" OR schema_title="system.ExperimentRun""#, &run));
        assert!(ok(r#"metadata.lr.number_value > 0.05 AND metadata.lr.number_value <= 0.1"#, &run));
        assert!(ok(r#"metadata.state.string_value = "COMPLETE""#, &run));
        assert!(ok(r#"metadata.deleted.bool_value = false"#, &run));
        assert!(ok(r#"metadata.`my key`.string_value = "v""#, &run));
        assert!(ok(r#"metadata:"lr""#, &run));
        assert!(ok(r#"display_name:"run-*""#, &run));
        assert!(ok(r#"NOT display_name="x" AND -display_name="y""#, &run));
        assert!(ok(r#"create_time >= "2026-12-07T00:00:00Z""#, &run));
        assert!(ok(r#"in_context("projects/p/locations/r/metadataStores/default/contexts/e")"#, &run));
        assert!(!ok(r#"in_context("projects/p/locations/r/metadataStores/default/contexts/other")"#, &run));
        assert!(ok(r#"metadata.missing.string_value != "x""#, &run), "not set is not equal");
        assert!(ok(r#"(display_name="run-1" OR display_name="x") AND schema_title="system.ExperimentRun""#, &run));
        assert!(ok("", &run));
    }

    /// The store narrows by the comparisons at the top of a filter only: an OR or a NOT
    /// narrows nothing (a record the narrowing leaves out could pass them).
    #[test]
    fn narrowing_takes_top_level_conjuncts_only() {
        let f = parse(r#"schema_title="system.Metrics" AND in_context("c") AND display_name="d""#).unwrap();
        let n = f.narrow();
        assert_eq!((n.schema_title, n.context, n.display_name), (Some("system.Metrics"), Some("c"), Some("d")));
        let n = parse(r#"parent_contexts:"p""#).unwrap();
        assert_eq!(n.narrow().context, Some("p"));
        for f in [r#"schema_title="a" OR schema_title="b""#, r#"NOT schema_title="a""#, r#"schema_title!="a""#, r#"parent_contexts:"p*""#] {
            let p = parse(f).unwrap();
            let n = p.narrow();
            assert!(n.schema_title.is_none() && n.context.is_none(), "{f}");
        }
    }

    /// Bad filters are errors that say what is wrong; a bomb is refused by its depth or
    /// length, not evaluated.
    #[test]
    fn bad_filters_name_the_fault() {
        for (f, want) in [
            ("display_name=", "expected a value"),
            ("display_name \"x\"", "expected an operator"),
            ("(display_name=\"x\"", "expected \")\""),
            ("display_name=\"x", "not closed"),
            ("nope(\"x\")", "unknown function"),
            ("a=1 )", "after a complete filter"),
        ] {
            let e = parse(f).unwrap_err();
            assert!(e.contains(want), "{f}: {e}");
        }
        let deep = format!("{}a=1{}", "(".repeat(1000), ")".repeat(1000));
        assert!(parse(&deep).unwrap_err().contains("deeper than"));
        let long = "a=1 AND ".repeat(2000);
        assert!(parse(&long).unwrap_err().contains("at most"));
    }
}
