//! proto3-JSON helpers: int64 as strings, lenient int32 and double input, enums by name
//! or number, `enum-encoding=int` output, and request-body parsing that answers with the
//! service's own error text.

use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::{Deserialize, Serializer};

use crate::error::ApiError;

/// Deepest nesting of objects and arrays accepted in a request body.
pub const MAX_DEPTH: usize = 64;

// ---------------------------------------------------------------------------------------
// Enums

/// A name or number that is not a value of the enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {value} for enum {enum_name}")]
pub struct UnknownEnumValue {
    /// Full proto name of the enum type.
    pub enum_name: &'static str,
    /// The offending value, quoted when it was a name.
    pub value: String,
}

impl UnknownEnumValue {
    /// An error for `value` (a name or a number) of enum `enum_name`.
    pub fn new(enum_name: &'static str, value: impl UnknownValue) -> Self {
        UnknownEnumValue {
            enum_name,
            value: value.describe(),
        }
    }
}

/// How an unknown enum value is shown in an error.
pub trait UnknownValue {
    /// The value as shown in the message (names quoted, numbers bare).
    fn describe(&self) -> String;
}

impl UnknownValue for &str {
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

impl UnknownValue for i32 {
    fn describe(&self) -> String {
        self.to_string()
    }
}

/// What every proto enum of this crate offers (see the `proto_enum!` definitions).
pub trait ProtoEnum: Sized + Copy + 'static {
    /// Full proto name of the enum type.
    const PROTO_NAME: &'static str;
    /// The wire name.
    fn name(self) -> &'static str;
    /// The proto number.
    fn number(self) -> i32;
    /// The value with this wire name.
    fn from_name(name: &str) -> Result<Self, UnknownEnumValue>;
    /// The value with this number.
    fn from_number(number: i32) -> Result<Self, UnknownEnumValue>;
}

/// Deserialises an enum from its name, its number (JSON number or numeric string) or
/// `null` (the value numbered 0).
pub fn deserialize_enum<'de, D, E>(d: D) -> Result<E, D::Error>
where
    D: Deserializer<'de>,
    E: ProtoEnum,
{
    struct EnumVisitor<E>(std::marker::PhantomData<E>);

    impl<E: ProtoEnum> EnumVisitor<E> {
        fn number<Er: de::Error>(n: i128) -> Result<E, Er> {
            let n = i32::try_from(n)
                .map_err(|_| Er::custom(format!("unknown value {n} for enum {}", E::PROTO_NAME)))?;
            E::from_number(n).map_err(Er::custom)
        }
    }

    impl<E: ProtoEnum> Visitor<'_> for EnumVisitor<E> {
        type Value = E;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a name or number of enum {}", E::PROTO_NAME)
        }

        fn visit_str<Er: de::Error>(self, v: &str) -> Result<E, Er> {
            match E::from_name(v) {
                Ok(e) => Ok(e),
                Err(err) => match parse_decimal_integer(v) {
                    Some(n) => Self::number(n),
                    None => Err(Er::custom(err)),
                },
            }
        }

        fn visit_i64<Er: de::Error>(self, v: i64) -> Result<E, Er> {
            Self::number(i128::from(v))
        }

        fn visit_u64<Er: de::Error>(self, v: u64) -> Result<E, Er> {
            Self::number(i128::from(v))
        }

        fn visit_f64<Er: de::Error>(self, v: f64) -> Result<E, Er> {
            match integral_f64(v) {
                Some(n) => Self::number(n),
                None => Err(Er::custom(format!(
                    "unknown value {v} for enum {}",
                    E::PROTO_NAME
                ))),
            }
        }

        fn visit_unit<Er: de::Error>(self) -> Result<E, Er> {
            Self::number(0)
        }
    }

    d.deserialize_any(EnumVisitor(std::marker::PhantomData))
}

/// Parses an optionally signed run of decimal digits (no spaces, no exponent).
fn parse_decimal_integer(text: &str) -> Option<i128> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i128>().ok()
}

/// The integer held by a float with no fractional part, within i64 range.
fn integral_f64(v: f64) -> Option<i128> {
    if v.is_finite() && v.fract() == 0.0 && v.abs() <= 9.3e18 {
        Some(v as i128)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------
// Integers

struct IntVisitor {
    kind: &'static str,
    min: i128,
    max: i128,
}

impl IntVisitor {
    const INT64: IntVisitor = IntVisitor {
        kind: "int64",
        min: i64::MIN as i128,
        max: i64::MAX as i128,
    };
    const INT32: IntVisitor = IntVisitor {
        kind: "int32",
        min: i32::MIN as i128,
        max: i32::MAX as i128,
    };

    fn check<E: de::Error>(&self, n: i128) -> Result<i128, E> {
        if n < self.min || n > self.max {
            Err(E::custom(format!(
                "{} value {n} is out of range",
                self.kind
            )))
        } else {
            Ok(n)
        }
    }
}

impl Visitor<'_> for IntVisitor {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an {} (a number or a decimal string)", self.kind)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
        self.check(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
        self.check(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i128, E> {
        match integral_f64(v) {
            Some(n) => self.check(n),
            None => Err(E::custom(format!("invalid {} value {v}", self.kind))),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i128, E> {
        if let Some(n) = parse_decimal_integer(v) {
            return self.check(n);
        }
        // proto3 JSON also accepts "1e3" and "5.0" when the value is integral.
        let numeric = !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
        match v.parse::<f64>() {
            Ok(f) if numeric => match integral_f64(f) {
                Some(n) => self.check(n),
                None => Err(E::custom(format!("invalid {} value {v:?}", self.kind))),
            },
            _ => Err(E::custom(format!("invalid {} value {v:?}", self.kind))),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<i128, E> {
        Ok(0)
    }
}

/// An int64 on the wire: a string on output, a string or a number on input.
struct Int64Wire(i64);

impl<'de> Deserialize<'de> for Int64Wire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = d.deserialize_any(IntVisitor::INT64)?;
        // IntVisitor::INT64 already checked the range.
        Ok(Int64Wire(i64::try_from(n).map_err(de::Error::custom)?))
    }
}

/// `int64` fields: `#[serde(with = "crate::json::int64")]`.
pub mod int64 {
    use super::*;

    /// Writes the value as a decimal string.
    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads a number or a decimal string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        Int64Wire::deserialize(d).map(|w| w.0)
    }

    /// `Option<i64>` fields (proto3 `optional int64`).
    pub mod option {
        use super::*;

        /// Writes `Some` as a decimal string, `None` as null.
        pub fn serialize<S: Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(n) => s.collect_str(n),
                None => s.serialize_none(),
            }
        }

        /// Reads null, a number or a decimal string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
            Option::<Int64Wire>::deserialize(d).map(|o| o.map(|w| w.0))
        }
    }

    /// `repeated int64` fields.
    pub mod vec {
        use super::*;
        use serde::ser::SerializeSeq;

        /// Writes every element as a decimal string.
        pub fn serialize<S: Serializer>(v: &[i64], s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(v.len()))?;
            for n in v {
                seq.serialize_element(&n.to_string())?;
            }
            seq.end()
        }

        /// Reads a list of numbers or decimal strings.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
            Vec::<Int64Wire>::deserialize(d).map(|v| v.into_iter().map(|w| w.0).collect())
        }
    }
}

/// `int32` fields: a number on output; a number or a decimal string on input.
pub mod int32 {
    use super::*;

    /// Writes the value as a JSON number.
    pub fn serialize<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(*v)
    }

    /// Reads a number or a decimal string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        let n = d.deserialize_any(IntVisitor::INT32)?;
        i32::try_from(n).map_err(de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------
// Doubles

struct DoubleVisitor;

impl Visitor<'_> for DoubleVisitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a double (a number, a numeric string, \"NaN\", \"Infinity\" or \"-Infinity\")")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        match v {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => {
                let numeric = !v.is_empty()
                    && v.bytes().all(|b| {
                        b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')
                    });
                match v.parse::<f64>() {
                    Ok(f) if numeric && f.is_finite() => Ok(f),
                    _ => Err(E::custom(format!("invalid double value {v:?}"))),
                }
            }
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
        Ok(0.0)
    }
}

struct DoubleWire(f64);

impl<'de> Deserialize<'de> for DoubleWire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DoubleVisitor).map(DoubleWire)
    }
}

fn write_double<S: Serializer>(v: f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_nan() {
        s.serialize_str("NaN")
    } else if v == f64::INFINITY {
        s.serialize_str("Infinity")
    } else if v == f64::NEG_INFINITY {
        s.serialize_str("-Infinity")
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        // Integral values print without a fraction, as the service does (`16`, not `16.0`).
        s.serialize_i64(v as i64)
    } else {
        s.serialize_f64(v)
    }
}

/// `double` fields: numbers on output (`"NaN"`, `"Infinity"`, `"-Infinity"` for the
/// non-finite values); numbers or numeric strings on input.
pub mod double {
    use super::*;

    /// Writes the value.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        write_double(*v, s)
    }

    /// Reads a number or a numeric string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        DoubleWire::deserialize(d).map(|w| w.0)
    }

    /// `Option<f64>` fields (proto3 `optional double`).
    pub mod option {
        use super::*;

        /// Writes `Some` as a number, `None` as null.
        pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(f) => write_double(*f, s),
                None => s.serialize_none(),
            }
        }

        /// Reads null, a number or a numeric string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            Option::<DoubleWire>::deserialize(d).map(|o| o.map(|w| w.0))
        }
    }

    /// `repeated double` fields.
    pub mod vec {
        use super::*;
        use serde::ser::SerializeSeq;

        struct Elem(f64);

        impl serde::Serialize for Elem {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                write_double(self.0, s)
            }
        }

        /// Writes every element as a number.
        pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(v.len()))?;
            for f in v {
                seq.serialize_element(&Elem(*f))?;
            }
            seq.end()
        }

        /// Reads a list of numbers or numeric strings.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
            Vec::<DoubleWire>::deserialize(d).map(|v| v.into_iter().map(|w| w.0).collect())
        }
    }
}

// ---------------------------------------------------------------------------------------
// skip_serializing_if helpers

/// True for 0 (`skip_serializing_if`).
pub fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// True for 0 (`skip_serializing_if`).
pub fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

/// True for 0.0 (`skip_serializing_if`).
pub fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

/// True for false (`skip_serializing_if`).
pub fn is_false(v: &bool) -> bool {
    !*v
}


// ---------------------------------------------------------------------------------------
// Request bodies

/// Checks that `text` nests objects and arrays at most `max` levels deep (strings are
/// skipped, escapes respected). Returns the byte offset of the first bracket too deep.
pub fn check_depth(text: &[u8], max: usize) -> Result<(), usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in text.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return Err(i);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Parses a request body into `T` with the service's error text.
///
/// `root` is the snake_case name of the request field the body maps to (`custom_job`),
/// used in error paths such as `'custom_job.job_spec'`. An empty body is an empty
/// message. Errors are all `INVALID_ARGUMENT`:
/// - invalid UTF-8, nesting deeper than [`MAX_DEPTH`], a top level that is not an object;
/// - syntax errors: `Invalid JSON payload received. Expected , or } after key:value pair.
///   (line 1 column 17)`;
/// - unknown fields: `Invalid JSON payload received. Unknown name "foo" at
///   'custom_job.job_spec': Cannot find field.`;
/// - wrong types and bad values: `Invalid JSON payload received. Invalid value at
///   'custom_job.job_spec.worker_pool_specs[0].replica_count': ...`.
pub fn from_body<T: DeserializeOwned>(body: &[u8], root: &str) -> Result<T, ApiError> {
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) => {
            return Err(ApiError::invalid_argument(format!(
                "Invalid JSON payload received. The request body is not valid UTF-8 \
                 (invalid byte at offset {}).",
                e.valid_up_to()
            )))
        }
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let trimmed = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if trimmed.is_empty() {
        return serde_json::from_str("{}").map_err(|e| map_serde_error(&e, "{}", root));
    }
    if let Err(offset) = check_depth(text.as_bytes(), MAX_DEPTH) {
        let (line, column) = line_column(text, offset);
        return Err(ApiError::invalid_argument(format!(
            "Invalid JSON payload received. Nesting of objects and arrays is deeper than \
             {MAX_DEPTH} levels. (line {line} column {column})"
        )));
    }
    if !trimmed.starts_with('{') {
        return Err(ApiError::invalid_argument(format!(
            "Invalid JSON payload received. Expected a JSON object for '{root}'."
        )));
    }
    match serde_json::from_str(text) {
        Ok(v) => Ok(v),
        // proto3's JSON mapping: `null` is accepted for any field and means its default
        // (an empty list, no message). Only when a null was refused is the body read
        // again with every null member left out (so errors name the field as when absent).
        Err(e) if e.to_string().starts_with("invalid type: null") => {
            let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| map_serde_error(&e, text, root))?;
            drop_nulls(&mut v);
            let again = v.to_string();
            serde_json::from_str(&again).map_err(|e| map_serde_error(&e, &again, root))
        }
        Err(e) => Err(map_serde_error(&e, text, root)),
    }
}

/// Object members whose value is `null`, at any depth, left out.
fn drop_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    (line, offset - start + 1)
}

fn map_serde_error(err: &serde_json::Error, text: &str, root: &str) -> ApiError {
    use serde_json::error::Category;

    let (line, column) = (err.line(), err.column());
    let full = err.to_string();
    let msg = full
        .strip_suffix(&format!(" at line {line} column {column}"))
        .unwrap_or(&full)
        .to_string();
    let at = format!("(line {line} column {column})");
    let message = match err.classify() {
        Category::Eof => format!("Invalid JSON payload received. Unexpected end of string. {at}"),
        Category::Syntax | Category::Io => {
            format!("Invalid JSON payload received. {} {at}", syntax_text(&msg))
        }
        Category::Data => {
            let offset = byte_offset(text, line, column);
            let mut frames = path_frames(text, offset);
            if let Some(name) = backticked(&msg, "unknown field `") {
                drop_last_key(&mut frames);
                format!(
                    "Invalid JSON payload received. Unknown name {name:?} at '{}': Cannot find field.",
                    render_path(root, &frames)
                )
            } else if let Some(name) = backticked(&msg, "duplicate field `") {
                drop_last_key(&mut frames);
                format!(
                    "Invalid JSON payload received. Duplicate field {name:?} at '{}'.",
                    render_path(root, &frames)
                )
            } else {
                format!(
                    "Invalid JSON payload received. Invalid value at '{}': {msg}.",
                    render_path(root, &frames)
                )
            }
        }
    };
    ApiError::invalid_argument(message)
}

fn syntax_text(msg: &str) -> String {
    let known = [
        ("expected `:`", "Expected : between key:value pair."),
        ("expected `,` or `]`", "Expected , or ] after list value."),
        (
            "expected `,` or `}`",
            "Expected , or } after key:value pair.",
        ),
        ("expected ident", "Invalid token."),
        ("expected value", "Unexpected token."),
        ("key must be a string", "Expected a string key."),
        ("invalid escape", "Invalid escape sequence in string."),
        ("invalid number", "Invalid number."),
        ("number out of range", "Number out of range."),
        ("invalid unicode code point", "Invalid unicode code point."),
        ("control character", "Control character in string."),
        ("trailing comma", "Trailing comma."),
        (
            "trailing characters",
            "Unexpected data after the end of the JSON value.",
        ),
        (
            "lone leading surrogate",
            "Invalid escape sequence in string.",
        ),
        (
            "unexpected end of hex escape",
            "Invalid escape sequence in string.",
        ),
        (
            "recursion limit exceeded",
            "Nesting of objects and arrays is too deep.",
        ),
    ];
    for (prefix, text) in known {
        if msg.starts_with(prefix) {
            return text.to_string();
        }
    }
    let mut chars = msg.chars();
    match chars.next() {
        Some(c) => format!("{}{}.", c.to_uppercase(), chars.as_str()),
        None => "Syntax error.".to_string(),
    }
}

fn backticked(msg: &str, prefix: &str) -> Option<String> {
    let rest = msg.strip_prefix(prefix)?;
    let end = rest.find('`')?;
    Some(rest[..end].to_string())
}

/// The byte offset of serde_json's (line, column) position: `column` bytes after the
/// start of the line.
fn byte_offset(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0usize;
    let mut current = 1usize;
    if line > 1 {
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                current += 1;
                if current == line {
                    start = i + 1;
                    break;
                }
            }
        }
    }
    (start + column).min(text.len())
}

#[derive(Debug)]
enum Frame {
    /// An object, with the key whose value is being read (None between members).
    Object(Option<String>),
    /// An array, with the index of the element being read.
    Array(usize),
}

/// The objects and arrays open at byte `end` of `text`, with their current key/index.
fn path_frames(text: &str, end: usize) -> Vec<Frame> {
    let bytes = text.as_bytes();
    let end = end.min(bytes.len());
    let mut frames: Vec<Frame> = Vec::new();
    let mut i = 0usize;
    while i < end {
        match bytes[i] {
            b'{' => frames.push(Frame::Object(None)),
            b'[' => frames.push(Frame::Array(0)),
            b'}' | b']' => {
                frames.pop();
            }
            b',' => match frames.last_mut() {
                Some(Frame::Array(n)) => *n += 1,
                Some(Frame::Object(key)) => *key = None,
                None => {}
            },
            b'"' => {
                let start = i;
                let mut j = i + 1;
                let mut escaped = false;
                while j < bytes.len() {
                    let b = bytes[j];
                    if escaped {
                        escaped = false;
                    } else if b == b'\\' {
                        escaped = true;
                    } else if b == b'"' {
                        break;
                    }
                    j += 1;
                }
                // j is the closing quote (or the end of the text).
                if j >= end {
                    break;
                }
                if let Some(Frame::Object(key @ None)) = frames.last_mut() {
                    let raw = &text[start..=j];
                    let decoded = serde_json::from_str::<String>(raw)
                        .unwrap_or_else(|_| text[start + 1..j].to_string());
                    *key = Some(decoded);
                }
                i = j;
            }
            _ => {}
        }
        i += 1;
    }
    frames
}

/// For errors about a key itself (unknown, duplicate): the path is the object's, so the
/// key just read is dropped.
fn drop_last_key(frames: &mut [Frame]) {
    if let Some(Frame::Object(key)) = frames.last_mut() {
        *key = None;
    }
}

const MAP_FIELDS: &[&str] = &["labels", "webAccessUris", "web_access_uris"];

fn render_path(root: &str, frames: &[Frame]) -> String {
    let mut out = root.to_string();
    let mut parent_is_map = false;
    // The first frame is the body's own object: its members hang off `root`.
    for frame in frames {
        match frame {
            Frame::Object(Some(key)) => {
                if parent_is_map {
                    out.push('[');
                    out.push_str(key);
                    out.push(']');
                    parent_is_map = false;
                } else {
                    out.push('.');
                    out.push_str(&to_snake_case(key));
                    parent_is_map = MAP_FIELDS.contains(&key.as_str());
                }
            }
            Frame::Object(None) => {
                parent_is_map = false;
            }
            Frame::Array(index) => {
                out.push_str(&format!("[{index}]"));
                parent_is_map = false;
            }
        }
    }
    out
}

/// `jobSpec` → `job_spec`; snake_case names are unchanged.
pub fn to_snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_scan_skips_strings_and_escapes() {
        assert!(check_depth(br#"{"a":"[[[[[[\"[[["}"#, 2).is_ok());
        assert_eq!(check_depth(b"[[[", 2), Err(2));
        assert!(check_depth(b"[[]][[]]", 2).is_ok());
    }

    #[test]
    fn snake_case() {
        assert_eq!(to_snake_case("workerPoolSpecs"), "worker_pool_specs");
        assert_eq!(to_snake_case("worker_pool_specs"), "worker_pool_specs");
        assert_eq!(to_snake_case("name"), "name");
    }

    /// proto3's JSON mapping: a `null` member is its field's default, so a null list gets
    /// the words of a missing one (the validator's), not the parser's.
    #[test]
    fn a_null_member_is_read_as_absent() {
        let job = crate::types::parse_custom_job(br#"{"displayName": "x", "jobSpec": {"workerPoolSpecs": null, "scheduling": null}}"#);
        let missing = crate::types::parse_custom_job(br#"{"displayName": "x", "jobSpec": {}}"#);
        assert_eq!(job.expect("a null list is an empty one"), missing.expect("parsed"));
        let bad = crate::types::parse_custom_job(br#"{"displayName": null, "jobSpec": {"workerPoolSpecs": [{"replicaCount": "x"}]}}"#).unwrap_err();
        assert!(bad.message.contains("replica_count"), "other errors still name their field: {}", bad.message);
    }

    #[test]
    fn frames_at_offset() {
        let text = r#"{"a": {"b": [1, {"c": 2"#;
        let frames = path_frames(text, text.len());
        assert_eq!(render_path("r", &frames), "r.a.b[1].c");
    }
}
