//! How the client commands print what they show: one resource, or a list of them, as a
//! table, JSON or YAML (`--format`). Every command that prints a resource or a list goes
//! through [`print_value`] or [`print_list`].

use clap::{Args, ValueEnum};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Columns for a list; FIELD and VALUE rows for one resource.
    Table,
    /// The resources as the API returns them, indented JSON.
    Json,
    /// The same as YAML.
    Yaml,
    /// A list's columns (or one resource's fields) as CSV (RFC 4180), a header first.
    Csv,
}

/// `--format` of a command that prints a list (a table unless asked otherwise).
#[derive(Args, Clone, Copy)]
pub struct ListFormat {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// `--format` of a command that prints one resource (YAML unless asked otherwise).
#[derive(Args, Clone, Copy)]
pub struct ResourceFormat {
    /// Output format.
    #[arg(long, value_enum, default_value = "yaml")]
    pub format: Format,
}

/// `--format` of a command that creates a resource: without it, a message saying what was
/// created and what to run next; with it, the resource itself.
#[derive(Args, Clone, Copy)]
pub struct CreatedFormat {
    /// Print the created resource in this format instead of the message (with --wait: the
    /// resource as it ended).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
}

/// A column of a list table: its heading and its cell of a resource.
pub type Column = (&'static str, fn(&Value) -> String);

/// A string field of a resource, or nothing.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A list: a table with these columns, or the resources themselves as JSON or YAML.
pub fn print_list(items: &[Value], columns: &[Column], format: Format) -> anyhow::Result<()> {
    match format {
        Format::Table => {
            let rows: Vec<Vec<String>> =
                items.iter().map(|item| columns.iter().map(|(_, cell)| one_line(&cell(item), 100)).collect()).collect();
            let head: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
            table(&head, &rows);
            Ok(())
        }
        Format::Csv => {
            let head: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
            let rows: Vec<Vec<String>> = items.iter().map(|item| columns.iter().map(|(_, cell)| cell(item)).collect()).collect();
            print!("{}", csv_text(&head, &rows)?);
            Ok(())
        }
        f => print_value(&Value::Array(items.to_vec()), f),
    }
}

/// A header and rows as CSV.
fn csv_text(head: &[&str], rows: &[Vec<String>]) -> anyhow::Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(head)?;
    for r in rows {
        w.write_record(r)?;
    }
    Ok(String::from_utf8(w.into_inner().map_err(|e| anyhow::anyhow!("CSV: {e}"))?)?)
}

/// One resource (or any value) in the format asked for.
pub fn print_value(v: &Value, format: Format) -> anyhow::Result<()> {
    print!("{}", render_value(v, format)?);
    Ok(())
}

/// What [`print_value`] prints.
pub fn render_value(v: &Value, format: Format) -> anyhow::Result<String> {
    Ok(match (format, v) {
        (Format::Json, _) => format!("{}\n", serde_json::to_string_pretty(v)?),
        // One resource as a table: a row per field, nested values in one line.
        (Format::Table, Value::Object(fields)) => {
            let rows: Vec<Vec<String>> = fields.iter().map(|(k, v)| vec![k.clone(), one_line(&text(v), 100)]).collect();
            table_text(&["FIELD", "VALUE"], &rows)
        }
        (Format::Csv, Value::Object(fields)) => {
            let rows: Vec<Vec<String>> = fields.iter().map(|(k, v)| vec![k.clone(), text(v)]).collect();
            csv_text(&["FIELD", "VALUE"], &rows)?
        }
        (Format::Csv, Value::Array(items)) => {
            let rows: Vec<Vec<String>> = items.iter().map(|v| vec![text(v)]).collect();
            csv_text(&["VALUE"], &rows)?
        }
        (Format::Yaml | Format::Table | Format::Csv, _) => serde_norway::to_string(v)?,
    })
}

/// A value on one line of at most `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let cut: String = flat.chars().take(max.saturating_sub(3)).collect();
    format!("{cut}...")
}

pub fn table(head: &[&str], rows: &[Vec<String>]) {
    print!("{}", table_text(head, rows));
}

fn table_text(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells.iter().enumerate().map(|(i, c)| format!("{c:w$}", w = w[i])).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let mut out = line(head.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_resource_in_each_format() {
        let v = json!({"name": "n", "labels": {"a": "b"}});
        let t = render_value(&v, Format::Table).unwrap();
        assert!(t.starts_with("FIELD"), "{t}");
        assert!(t.contains("labels  {\"a\":\"b\"}"), "{t}");
        let j: Value = serde_json::from_str(&render_value(&v, Format::Json).unwrap()).unwrap();
        assert_eq!(j, v);
        let y: Value = serde_norway::from_str(&render_value(&v, Format::Yaml).unwrap()).unwrap();
        assert_eq!(y, v);
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let t = csv_text(&["A", "B"], &[vec!["x,y".into(), "say \"hi\"".into()], vec!["1".into(), "".into()]]).unwrap();
        assert_eq!(t, "A,B\n\"x,y\",\"say \"\"hi\"\"\"\n1,\n");
    }

    #[test]
    fn wide_characters_align() {
        let t = table_text(&["A", "B"], &[vec!["é".into(), "x".into()], vec!["ab".into(), "y".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[1].chars().count(), lines[2].chars().count(), "{t}");
    }
}
