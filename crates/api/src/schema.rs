//! JSON Schema descriptions (schemars) of the proto3-JSON forms used by the wire types,
//! behind the `schema` feature.
//!
//! The schemas describe the OUTPUT form, the one the server prints: int64 as decimal
//! strings, enums as their names, `Duration` as `"3600s"`, `Timestamp` as RFC 3339.
//! Input is more lenient (numbers for int64, numbers for enums, `null` for defaults).
//!
//! The marker types below are only used in `#[schemars(with = "...")]` attributes of the
//! fields whose serde form comes from a custom module of [`crate::json`].

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

/// Pattern of an int64 printed as a decimal string.
pub const INT64_PATTERN: &str = "^-?[0-9]+$";
/// Pattern of a printed `google.protobuf.Duration`.
pub const DURATION_PATTERN: &str = r"^-?[0-9]+(\.[0-9]{1,9})?s$";

/// `int64` (`crate::json::int64`): a decimal string on output.
pub struct Int64;

impl JsonSchema for Int64 {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Int64".into()
    }
    fn schema_id() -> Cow<'static, str> {
        "trainyard_api::schema::Int64".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "format": "int64",
            "pattern": INT64_PATTERN,
        })
    }
}

/// `int32` (`crate::json::int32`): a JSON number on output.
pub struct Int32;

impl JsonSchema for Int32 {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Int32".into()
    }
    fn schema_id() -> Cow<'static, str> {
        "trainyard_api::schema::Int32".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "integer",
            "format": "int32",
            "minimum": i32::MIN,
            "maximum": i32::MAX,
        })
    }
}

/// `double` (`crate::json::double`): a JSON number on output, or one of the strings
/// `"NaN"`, `"Infinity"`, `"-Infinity"` for the non-finite values.
pub struct Double;

impl JsonSchema for Double {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Double".into()
    }
    fn schema_id() -> Cow<'static, str> {
        "trainyard_api::schema::Double".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                {"type": "number", "format": "double"},
                {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]},
            ]
        })
    }
}

/// A `google.protobuf.Any` in JSON: an object with its `@type` and the message's fields.
pub struct Any;

impl JsonSchema for Any {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Any".into()
    }
    fn schema_id() -> Cow<'static, str> {
        "trainyard_api::schema::Any".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "description": "A google.protobuf.Any: \"@type\" names the message, the other members are its fields.",
            "properties": {"@type": {"type": "string"}},
            "additionalProperties": true,
        })
    }
}

/// A `google.protobuf.Value` limited to what a trial parameter holds: a number or a string.
pub struct NumberOrString;

impl JsonSchema for NumberOrString {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "NumberOrString".into()
    }
    fn schema_id() -> Cow<'static, str> {
        "trainyard_api::schema::NumberOrString".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [{"type": "number"}, {"type": "string"}]
        })
    }
}

/// The schema of a proto enum: a string, one of its names.
pub fn proto_enum_schema(proto_name: &str, names: Vec<&'static str>) -> Schema {
    json_schema!({
        "type": "string",
        "enum": names,
        "description": format!("{proto_name}, by name (a number is also accepted on input)."),
    })
}
