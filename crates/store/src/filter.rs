//! The AIP-160 filter subset of the list methods, compiled to SQL over the `jobs` and
//! `labels` tables, so that a filtered list reads only what it shows.
//!
//! Fields: `display_name`, `state`, `create_time`, `update_time`, `labels.KEY` (and their
//! camelCase spellings). Operators: `=`, `!=`, `<`, `>`, `<=`, `>=`, `:` (has).
//! `AND`, `OR`, `NOT` (or `-`), parentheses, juxtaposition as AND, quoted strings, RFC
//! 3339 times. As in AIP-160, `OR` binds tighter than `AND`. `*` in a `display_name`
//! or label value compared with `=` is a wildcard.
//!
//! Limits keep a filter's parse and its SQL small: at most [`MAX_LEN`] bytes, at most
//! [`MAX_COMPARISONS`] comparisons, and parentheses and `NOT`s nested at most
//! [`MAX_DEPTH`] levels deep. `AND` and `OR` chains compile to one flat SQL list each, so
//! with these limits the SQL expression stays far below SQLite's depth limit (1000).
//!
//! The SQL is the store's dialect: substrings by `instr` (SQLite) or `strpos`
//! (PostgreSQL), wildcards by `GLOB` or `LIKE`, both case-sensitive.

use crate::sql::{Dialect, Value};

/// Longest filter text, in bytes.
pub const MAX_LEN: usize = 8192;
/// Most comparisons in one filter.
pub const MAX_COMPARISONS: usize = 200;
/// Deepest nesting of parentheses and `NOT`s (together).
pub const MAX_DEPTH: usize = 64;

/// A filter that cannot be used; `column` is 1-based.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Invalid filter at column {column}: {message}")]
pub struct FilterError {
    pub column: usize,
    pub message: String,
}

/// SQL condition and its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub sql: String,
    pub params: Vec<Value>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Op(&'static str),
    LParen,
    RParen,
}

fn lex(text: &str) -> Result<Vec<(usize, Tok)>, FilterError> {
    let err = |at: usize, m: &str| FilterError { column: at + 1, message: m.to_string() };
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'(' => {
                out.push((i, Tok::LParen));
                i += 1
            }
            b')' => {
                out.push((i, Tok::RParen));
                i += 1
            }
            b'"' | b'\'' => {
                let start = i;
                i += 1;
                let mut s = String::new();
                loop {
                    let Some(&d) = b.get(i) else { return Err(err(start, "unterminated string")) };
                    if d == c {
                        i += 1;
                        break;
                    }
                    if d == b'\\' {
                        // The escaped character, whole (it may be several bytes long).
                        let Some(e) = text.get(i + 1..).and_then(|t| t.chars().next()) else {
                            return Err(err(i, "unterminated escape"));
                        };
                        s.push(e);
                        i += 1 + e.len_utf8();
                        continue;
                    }
                    // Multi-byte UTF-8: copy the whole character.
                    let ch = text[i..].chars().next().ok_or_else(|| err(i, "invalid character"))?;
                    s.push(ch);
                    i += ch.len_utf8();
                }
                out.push((start, Tok::Str(s)));
            }
            b'!' if b.get(i + 1) == Some(&b'=') => {
                out.push((i, Tok::Op("!=")));
                i += 2
            }
            b'<' | b'>' => {
                let two = b.get(i + 1) == Some(&b'=');
                out.push((i, Tok::Op(match (c, two) {
                    (b'<', true) => "<=",
                    (b'<', false) => "<",
                    (_, true) => ">=",
                    _ => ">",
                })));
                i += if two { 2 } else { 1 };
            }
            b'=' => {
                out.push((i, Tok::Op("=")));
                i += 1
            }
            b':' => {
                out.push((i, Tok::Op(":")));
                i += 1
            }
            b'-' if out.last().is_none_or(|(_, t)| !matches!(t, Tok::Op(_))) => {
                out.push((i, Tok::Word("NOT".into())));
                i += 1
            }
            _ => {
                let start = i;
                while i < b.len() && !b" \t\n\r()=!<>:\"'".contains(&b[i]) {
                    i += 1;
                }
                if i == start {
                    return Err(err(start, &format!("unexpected character {:?}", c as char)));
                }
                out.push((start, Tok::Word(text[start..i].to_string())));
            }
        }
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    end: usize,
    params: Vec<Value>,
    states: &'a [&'a str],
    dialect: Dialect,
    /// Parentheses and `NOT`s open around the current position.
    depth: usize,
    comparisons: usize,
}

impl Parser<'_> {
    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |(p, _)| *p)
    }
    fn err(&self, m: impl Into<String>) -> FilterError {
        FilterError { column: self.at() + 1, message: m.into() }
    }
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }
    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(x)) if x == w)
    }

    /// AIP-160: `AND` (or juxtaposition) over `OR`-terms.
    fn conjunction(&mut self) -> Result<String, FilterError> {
        let mut parts = vec![self.disjunction()?];
        loop {
            match self.peek() {
                None | Some(Tok::RParen) => break,
                Some(Tok::Word(w)) if w == "AND" => {
                    self.pos += 1;
                    parts.push(self.disjunction()?);
                }
                _ => parts.push(self.disjunction()?),
            }
        }
        Ok(if parts.len() == 1 { parts.remove(0) } else { format!("({})", parts.join(" AND ")) })
    }

    fn disjunction(&mut self) -> Result<String, FilterError> {
        let mut parts = vec![self.unary()?];
        while self.is_word("OR") {
            self.pos += 1;
            parts.push(self.unary()?);
        }
        Ok(if parts.len() == 1 { parts.remove(0) } else { format!("({})", parts.join(" OR ")) })
    }

    /// One more level of parentheses or `NOT`, refused past [`MAX_DEPTH`].
    fn enter(&mut self) -> Result<(), FilterError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err(format!("nesting deeper than {MAX_DEPTH} levels (parentheses and NOT)")));
        }
        self.depth += 1;
        Ok(())
    }

    fn unary(&mut self) -> Result<String, FilterError> {
        if self.is_word("NOT") {
            self.enter()?;
            self.pos += 1;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(format!("(NOT {inner})"));
        }
        match self.peek() {
            Some(Tok::LParen) => {
                self.enter()?;
                self.pos += 1;
                let inner = self.conjunction()?;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(self.err("expected ')'"));
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(inner)
            }
            Some(Tok::Word(w)) if w == "AND" || w == "OR" => Err(self.err(format!("unexpected {w}"))),
            Some(Tok::Word(_)) => self.comparison(),
            Some(_) => Err(self.err("expected a field name")),
            None => Err(self.err("expected a comparison")),
        }
    }

    fn value(&mut self) -> Result<(String, bool), FilterError> {
        match self.toks.get(self.pos).cloned() {
            Some((_, Tok::Str(s))) => {
                self.pos += 1;
                Ok((s, true))
            }
            Some((_, Tok::Word(w))) if !matches!(w.as_str(), "AND" | "OR" | "NOT") => {
                self.pos += 1;
                Ok((w, false))
            }
            _ => Err(self.err("expected a value")),
        }
    }

    fn param(&mut self, v: Value) -> &'static str {
        self.params.push(v);
        "?"
    }

    fn comparison(&mut self) -> Result<String, FilterError> {
        if self.comparisons >= MAX_COMPARISONS {
            return Err(self.err(format!("more than {MAX_COMPARISONS} comparisons")));
        }
        self.comparisons += 1;
        let field_at = self.at();
        let Some((_, Tok::Word(field))) = self.toks.get(self.pos).cloned() else { return Err(self.err("expected a field name")) };
        self.pos += 1;
        let op_at = self.at();
        let Some((_, Tok::Op(op))) = self.toks.get(self.pos).cloned() else {
            return Err(self.err(format!("expected an operator (=, !=, <, >, <=, >=, :) after {field}")));
        };
        self.pos += 1;
        let value_at = self.at();
        let (value, quoted) = self.value()?;
        let bad = |at: usize, m: String| FilterError { column: at + 1, message: m };
        match field.as_str() {
            "display_name" | "displayName" => self.text_comparison("display_name", op, &value, quoted),
            "state" => {
                if !matches!(op, "=" | "!=") {
                    return Err(bad(op_at, format!("state takes = or !=, not {op}")));
                }
                let name = match value.parse::<usize>() {
                    Ok(n) => self.states.get(n).map(|s| s.to_string()),
                    Err(_) => self.states.iter().find(|s| **s == value).map(|s| s.to_string()),
                };
                let Some(name) = name else {
                    return Err(bad(value_at, format!("{value:?} is not a job state (JOB_STATE_RUNNING, ...)")));
                };
                let p = self.param(Value::Text(name));
                Ok(format!("state {op} {p}"))
            }
            "create_time" | "createTime" | "update_time" | "updateTime" => {
                let column = if field.starts_with("create") { "create_time" } else { "update_time" };
                if op == ":" {
                    return Err(bad(op_at, format!("{field} takes =, !=, <, >, <=, >=")));
                }
                let t = time::OffsetDateTime::parse(&value, &time::format_description::well_known::Rfc3339)
                    .map_err(|_| bad(value_at, format!("{value:?} is not an RFC 3339 time such as \"2026-11-29T10:00:00Z\"")))?;
                let micros = (t.unix_timestamp_nanos() / 1000) as i64;
                let p = self.param(Value::Integer(micros));
                Ok(format!("{column} {op} {p}"))
            }
            "labels" if op == ":" => {
                // `labels:KEY`: the key is present.
                let p = self.param(Value::Text(value));
                Ok(format!("EXISTS (SELECT 1 FROM labels l WHERE l.job_id = jobs.id AND l.key = {p})"))
            }
            f if f.starts_with("labels.") && f.len() > "labels.".len() => {
                let key = f["labels.".len()..].to_string();
                if op == ":" && value == "*" && !quoted {
                    let p = self.param(Value::Text(key));
                    return Ok(format!("EXISTS (SELECT 1 FROM labels l WHERE l.job_id = jobs.id AND l.key = {p})"));
                }
                let kp = self.param(Value::Text(key));
                let cond = self.text_comparison("l.value", if op == "!=" { "=" } else { op }, &value, quoted)?;
                let exists = format!("EXISTS (SELECT 1 FROM labels l WHERE l.job_id = jobs.id AND l.key = {kp} AND {cond})");
                Ok(if op == "!=" { format!("(NOT {exists})") } else { exists })
            }
            _ => Err(bad(
                field_at,
                format!("unsupported field {field:?}; filter on display_name, state, create_time, update_time or labels.KEY"),
            )),
        }
    }

    fn text_comparison(&mut self, column: &str, op: &str, value: &str, quoted: bool) -> Result<String, FilterError> {
        let _ = quoted;
        Ok(match op {
            ":" => {
                let p = self.param(Value::Text(value.to_string()));
                match self.dialect {
                    Dialect::Sqlite => format!("instr({column}, {p}) > 0"),
                    Dialect::Postgres => format!("strpos({column}, {p}) > 0"),
                }
            }
            "=" | "!=" if value.contains('*') => {
                // Wildcards: `*` matches any run of characters; every other character is
                // itself (GLOB's and LIKE's own special characters escaped).
                let mut g = String::new();
                for ch in value.chars() {
                    match (self.dialect, ch) {
                        (Dialect::Sqlite, '*') => g.push('*'),
                        (Dialect::Sqlite, '?' | '[' | ']') => {
                            g.push('[');
                            g.push(ch);
                            g.push(']');
                        }
                        (Dialect::Postgres, '*') => g.push('%'),
                        (Dialect::Postgres, '%' | '_' | '\\') => {
                            g.push('\\');
                            g.push(ch);
                        }
                        (_, c) => g.push(c),
                    }
                }
                let p = self.param(Value::Text(g));
                let not = if op == "!=" { "NOT " } else { "" };
                match self.dialect {
                    Dialect::Sqlite => format!("{not}({column} GLOB {p})"),
                    Dialect::Postgres => format!("{not}({column} LIKE {p})"),
                }
            }
            _ => {
                let p = self.param(Value::Text(value.to_string()));
                format!("{column} {op} {p}")
            }
        })
    }
}

/// Compile a filter to `dialect`'s SQL. `states` are the job state names by number
/// (index = enum number).
pub fn compile(text: &str, states: &[&str], dialect: Dialect) -> Result<Option<Compiled>, FilterError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    if text.len() > MAX_LEN {
        return Err(FilterError { column: MAX_LEN + 1, message: format!("longer than {MAX_LEN} bytes") });
    }
    let toks = lex(text)?;
    let mut p = Parser { toks, pos: 0, end: text.len(), params: Vec::new(), states, dialect, depth: 0, comparisons: 0 };
    let sql = p.conjunction()?;
    if p.pos < p.toks.len() {
        return Err(p.err("unexpected ')'"));
    }
    Ok(Some(Compiled { sql, params: p.params }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: &[&str] = &[
        "JOB_STATE_UNSPECIFIED",
        "JOB_STATE_QUEUED",
        "JOB_STATE_PENDING",
        "JOB_STATE_RUNNING",
        "JOB_STATE_SUCCEEDED",
        "JOB_STATE_FAILED",
    ];

    fn sql(f: &str) -> String {
        compile(f, STATES, Dialect::Sqlite).unwrap().unwrap().sql
    }

    fn err(f: &str) -> FilterError {
        compile(f, STATES, Dialect::Sqlite).unwrap_err()
    }

    #[test]
    fn compiles_the_subset() {
        assert_eq!(sql("display_name=\"a\""), "display_name = ?");
        assert_eq!(sql("state=\"JOB_STATE_RUNNING\" AND labels.team=\"nlp\""), "(state = ? AND EXISTS (SELECT 1 FROM labels l WHERE l.job_id = jobs.id AND l.key = ? AND l.value = ?))");
        let c = compile("state=JOB_STATE_RUNNING OR state=3", STATES, Dialect::Sqlite).unwrap().unwrap();
        assert_eq!(c.sql, "(state = ? OR state = ?)");
        assert_eq!(c.params, vec![Value::Text("JOB_STATE_RUNNING".into()), Value::Text("JOB_STATE_RUNNING".into())]);
    }

    #[test]
    fn precedence_or_binds_tighter() {
        assert_eq!(sql("state=JOB_STATE_FAILED display_name:x OR display_name:y"), "(state = ? AND (instr(display_name, ?) > 0 OR instr(display_name, ?) > 0))");
        assert_eq!(sql("NOT (state=JOB_STATE_FAILED)"), "(NOT state = ?)");
        assert_eq!(sql("-state=JOB_STATE_FAILED"), "(NOT state = ?)");
    }

    #[test]
    fn times_and_labels() {
        let c = compile("create_time>\"2026-11-29T10:00:00Z\"", STATES, Dialect::Sqlite).unwrap().unwrap();
        assert_eq!(c.sql, "create_time > ?");
        assert_eq!(c.params, vec![Value::Integer(1_795_946_400_000_000)]);
        assert!(sql("labels.env:*").contains("l.key = ?)"));
        assert!(sql("labels:env").contains("l.key = ?)"));
        assert!(sql("labels.env!=\"prod\"").starts_with("(NOT EXISTS"));
        assert_eq!(sql("display_name=\"run-*\""), "(display_name GLOB ?)");
    }

    /// PostgreSQL's spelling: `strpos` for `:`, `LIKE` with `%`, `_` and `\` escaped
    /// for wildcards.
    #[test]
    fn postgres_spelling() {
        let c = compile("display_name:x AND display_name=\"a_b%*\\\\\"", STATES, Dialect::Postgres).unwrap().unwrap();
        assert_eq!(c.sql, "(strpos(display_name, ?) > 0 AND (display_name LIKE ?))");
        assert_eq!(c.params, vec![Value::Text("x".into()), Value::Text("a\\_b\\%%\\\\".into())]);
    }

    /// A regression found by the property test: an escaped multi-byte character.
    #[test]
    fn escaped_multibyte_character() {
        let c = compile("display_name=\"a\\\u{10b80}b\"", STATES, Dialect::Sqlite).unwrap().unwrap();
        assert_eq!(c.params, vec![Value::Text("a\u{10b80}b".into())]);
    }

    #[test]
    fn errors_name_the_position() {
        let e = err("state=\"JOB_STATE_RUNNING\" AND");
        assert_eq!(e.column, 30, "{e}");
        let e = err("colour=\"red\"");
        assert_eq!(e.column, 1);
        assert!(e.message.contains("colour"));
        let e = err("state=\"NOPE\"");
        assert_eq!(e.column, 7);
        let e = err("display_name=\"x");
        assert!(e.message.contains("unterminated"));
        let e = err("(state=JOB_STATE_FAILED");
        assert!(e.message.contains("')'"));
        let e = err("state=JOB_STATE_FAILED)");
        assert_eq!(e.column, 23);
        let e = err("create_time>\"yesterday\"");
        assert!(e.message.contains("RFC 3339"));
        let e = err("state<JOB_STATE_FAILED");
        assert_eq!(e.column, 6);
        assert!(err("display_name").message.contains("operator"));
    }

    /// A filter that is too long, too deep or too big is an error naming the limit (before,
    /// 4,000 parentheses overflowed the parser's stack, and 1,000 `NOT`s went past SQLite's
    /// expression depth).
    #[test]
    fn deep_parentheses_are_refused() {
        let deep = |n: usize| format!("{}state=1{}", "(".repeat(n), ")".repeat(n));
        let e = err(&deep(4000));
        assert_eq!(e.column, MAX_DEPTH + 1, "{e}");
        assert!(e.to_string().contains("nesting deeper than 64 levels"), "{e}");
        let e = err(&deep(10_000));
        assert!(e.to_string().contains("longer than 8192 bytes"), "{e}");
        assert_eq!(e.column, MAX_LEN + 1);
        // Unbalanced, as an attacker would send it.
        let e = err(&"(".repeat(8000));
        assert!(e.message.contains("nesting deeper than 64 levels"), "{e}");
        // At the limit it compiles.
        assert_eq!(sql(&deep(MAX_DEPTH)), "state = ?");
    }

    #[test]
    fn deep_nots_are_refused() {
        for not in ["NOT ", "-", "NOT (", "-("] {
            let text = format!("{}state=1", not.repeat(1000));
            let e = err(&text);
            assert!(e.message.contains("nesting deeper than 64 levels"), "{not:?}: {e}");
            assert!(e.column <= text.len(), "{e}");
        }
        let e = err(&format!("{}state=1", "NOT ".repeat(MAX_DEPTH + 1)));
        assert_eq!(e.column, 4 * MAX_DEPTH + 1, "{e}");
        assert!(sql(&format!("{}state=1", "NOT ".repeat(MAX_DEPTH))).starts_with("(NOT (NOT"));
        // Depth is the nesting, not the count: many NOTs side by side are fine.
        let flat = vec!["NOT state=1"; 100].join(" AND ");
        assert!(compile(&flat, STATES, Dialect::Sqlite).is_ok());
    }

    #[test]
    fn long_chains_are_refused() {
        for join in [" AND ", " OR ", " "] {
            // 5,000 terms: past the length limit.
            let e = err(&vec!["state=1"; 5000].join(join));
            assert!(e.message.contains("longer than 8192 bytes"), "{join:?}: {e}");
            // Short terms, one past the number of comparisons.
            let text = vec!["state=1"; MAX_COMPARISONS + 1].join(join);
            assert!(text.len() <= MAX_LEN);
            let e = err(&text);
            assert!(e.message.contains("more than 200 comparisons"), "{join:?}: {e}");
            assert_eq!(e.column, text.rfind("state").map_or(0, |i| i + 1), "{e}");
            // At the limit: one flat list, not nested binary expressions.
            let ok = sql(&vec!["state=1"; MAX_COMPARISONS].join(join));
            assert_eq!(ok.matches('(').count(), 1, "{ok}");
        }
    }

    /// The largest SQL the limits allow (deepest nesting around the longest chain of the
    /// deepest comparisons) runs in SQLite, whose expression depth limit is 1000, and in
    /// PostgreSQL.
    #[test]
    fn the_largest_filter_within_the_limits_runs() {
        crate::testdb::each(|_, store| {
            let chain = vec!["labels.k!=\"v*\""; MAX_COMPARISONS].join(" OR ");
            let text = format!("{}{chain}{}", "NOT (".repeat(MAX_DEPTH / 2), ")".repeat(MAX_DEPTH / 2));
            assert!(text.len() <= MAX_LEN);
            let c = compile(&text, STATES, store.dialect()).unwrap().unwrap();
            let rows = store.list_jobs("custom", "p", "r", Some((c.sql.as_str(), c.params.as_slice())), None, 10).unwrap();
            assert!(rows.is_empty());
            // A nested AND chain at every level as well.
            let mut text = String::from("state=1");
            for _ in 0..MAX_DEPTH {
                text = format!("state=1 AND ({text})");
            }
            let c = compile(&text, STATES, store.dialect()).unwrap().unwrap();
            assert!(store.list_jobs("custom", "p", "r", Some((c.sql.as_str(), c.params.as_slice())), None, 10).unwrap().is_empty());
        });
    }
}

#[cfg(test)]
mod no_panic {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Any text compiles or gives an error with a column inside (or just past) it.
        #[test]
        fn filters_never_panic(text in prop_oneof!["[ a-z_.=!<>:()\"'*0-9A-Z-]{0,40}", "\\PC{0,30}"]) {
            match compile(&text, &["JOB_STATE_UNSPECIFIED", "JOB_STATE_QUEUED"], Dialect::Sqlite) {
                Ok(_) => {}
                Err(e) => prop_assert!(e.column >= 1 && e.column <= text.len() + 1, "{e} for {text:?}"),
            }
        }
    }
}
