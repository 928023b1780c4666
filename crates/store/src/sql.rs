//! What the store's statements are made of, the same for SQLite and PostgreSQL: the
//! parameters ([`Value`]), the cells of a row ([`Cell`]) and the placeholders' spelling.
//!
//! Statements are written once, in the subset both databases run, with SQLite's
//! placeholders: `?N`, or `?` for the next number. For PostgreSQL they are rewritten to
//! `$N` ([`placeholders`]).

use crate::StoreError;

/// Which database a statement goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A statement's parameter. Every integer column is 64-bit (`INTEGER` in SQLite, `BIGINT`
/// in PostgreSQL), every real one a double, every text one text.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Integer(i64),
    Real(f64),
    Text(String),
    /// A NULL where a text is expected (PostgreSQL types its parameters).
    NullText,
    /// PostgreSQL only: a `bigint[]` (a batch's column, spread by `unnest`).
    Ints(Vec<i64>),
    /// PostgreSQL only: a `text[]`, NULLs allowed.
    Texts(Vec<Option<String>>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Integer(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}

impl From<Option<&str>> for Value {
    fn from(v: Option<&str>) -> Value {
        v.map_or(Value::NullText, Value::from)
    }
}

/// `[a, b, ...]` as parameters.
#[macro_export]
macro_rules! values {
    ($($v:expr),* $(,)?) => { &[$($crate::sql::Value::from($v)),*][..] };
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self {
            Value::Integer(i) => ToSqlOutput::Borrowed(ValueRef::Integer(*i)),
            Value::Real(f) => ToSqlOutput::Borrowed(ValueRef::Real(*f)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::NullText => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Ints(_) | Value::Texts(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure("arrays are parameters of PostgreSQL statements only".into()))
            }
        })
    }
}

impl postgres::types::ToSql for Value {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::{IsNull, ToSql};
        let wrong = || -> Box<dyn std::error::Error + Sync + Send> { format!("a {self:?} given for a parameter of type {ty}").into() };
        match self {
            Value::Integer(i) if <i64 as ToSql>::accepts(ty) => i.to_sql(ty, out),
            Value::Real(f) if <f64 as ToSql>::accepts(ty) => f.to_sql(ty, out),
            Value::Text(s) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            Value::NullText if <&str as ToSql>::accepts(ty) => Ok(IsNull::Yes),
            Value::Ints(v) if <Vec<i64> as ToSql>::accepts(ty) => v.to_sql(ty, out),
            Value::Texts(v) if <Vec<Option<String>> as ToSql>::accepts(ty) => v.to_sql(ty, out),
            _ => Err(wrong()),
        }
    }

    fn accepts(ty: &postgres::types::Type) -> bool {
        use postgres::types::ToSql;
        <i64 as ToSql>::accepts(ty)
            || <f64 as ToSql>::accepts(ty)
            || <&str as ToSql>::accepts(ty)
            || <Vec<i64> as ToSql>::accepts(ty)
            || <Vec<Option<String>> as ToSql>::accepts(ty)
    }

    postgres::types::to_sql_checked!();
}

/// One cell of a row read.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
}

/// A row read: its cells in the statement's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Row(pub Vec<Cell>);

impl Row {
    fn cell(&self, i: usize) -> Result<&Cell, StoreError> {
        self.0.get(i).ok_or_else(|| StoreError::Decode(format!("no column {i} in a row of {}", self.0.len())))
    }

    pub fn int(&self, i: usize) -> Result<i64, StoreError> {
        match self.cell(i)? {
            Cell::Integer(v) => Ok(*v),
            other => Err(StoreError::Decode(format!("column {i}: an integer expected, found {other:?}"))),
        }
    }

    pub fn real(&self, i: usize) -> Result<f64, StoreError> {
        match self.cell(i)? {
            Cell::Real(v) => Ok(*v),
            // SQLite keeps a real that has no fraction as written.
            Cell::Integer(v) => Ok(*v as f64),
            other => Err(StoreError::Decode(format!("column {i}: a number expected, found {other:?}"))),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, StoreError> {
        match self.cell(i)? {
            Cell::Text(v) => Ok(v.clone()),
            other => Err(StoreError::Decode(format!("column {i}: a text expected, found {other:?}"))),
        }
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }
}

/// `sql` with its placeholders as `dialect` spells them: SQLite's as written; for
/// PostgreSQL `?N` becomes `$N` and a bare `?` the next number after the largest so far
/// (SQLite's rule). Text in single quotes is left alone.
pub fn placeholders(sql: &str, dialect: Dialect) -> String {
    if dialect == Dialect::Sqlite {
        return sql.to_string();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut largest = 0u32;
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                let n = match digits.parse::<u32>() {
                    Ok(n) => n,
                    Err(_) => largest + 1,
                };
                largest = largest.max(n);
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_sqlites_numbering() {
        let sql = "SELECT 'a?b' FROM t WHERE a = ?2 AND b = ?1 AND c = ? AND d IN (?, ?5, ?)";
        assert_eq!(placeholders(sql, Dialect::Sqlite), sql);
        assert_eq!(placeholders(sql, Dialect::Postgres), "SELECT 'a?b' FROM t WHERE a = $2 AND b = $1 AND c = $3 AND d IN ($4, $5, $6)");
    }

    #[test]
    fn rows_say_what_they_expected() {
        let r = Row(vec![Cell::Integer(3), Cell::Text("x".into()), Cell::Null, Cell::Real(1.5)]);
        assert_eq!(r.int(0).unwrap(), 3);
        assert_eq!(r.real(0).unwrap(), 3.0);
        assert_eq!(r.text(1).unwrap(), "x");
        assert_eq!(r.opt_text(2).unwrap(), None);
        assert_eq!(r.real(3).unwrap(), 1.5);
        assert!(r.int(1).unwrap_err().to_string().contains("column 1: an integer expected"));
        assert!(r.text(9).is_err());
    }
}
