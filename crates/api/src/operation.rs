//! Long-running operations (`google.longrunning.Operation`), as returned by delete.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::types::{Status, Timestamp};

/// `@type` of the metadata of a delete operation.
pub const DELETE_OPERATION_METADATA_TYPE: &str =
    "type.googleapis.com/google.cloud.aiplatform.v1.DeleteOperationMetadata";

/// `@type` of `google.protobuf.Empty`, the response of a delete operation.
pub const EMPTY_TYPE: &str = "type.googleapis.com/google.protobuf.Empty";

/// `google.longrunning.Operation`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Operation {
    /// `projects/{p}/locations/{l}/operations/{id}` (or under the resource).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// A JSON `Any` with `@type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::schema::Any>"))]
    pub metadata: Option<Value>,
    /// True once finished.
    #[serde(skip_serializing_if = "crate::json::is_false")]
    pub done: bool,
    /// A JSON `Any` with `@type`, when done without error.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::schema::Any>"))]
    pub response: Option<Value>,
    /// The error, when done with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Status>,
}

impl Operation {
    /// A finished delete: `DeleteOperationMetadata` metadata and an `Empty` response.
    pub fn done_delete(
        name: impl Into<String>,
        create_time: Timestamp,
        update_time: Timestamp,
    ) -> Self {
        let metadata = DeleteOperationMetadata {
            generic_metadata: Some(GenericOperationMetadata {
                partial_failures: Vec::new(),
                create_time: Some(create_time),
                update_time: Some(update_time),
            }),
        };
        Operation {
            name: name.into(),
            metadata: Some(metadata.to_any()),
            done: true,
            response: Some(empty_any()),
            error: None,
        }
    }
}

/// `google.protobuf.Empty` as a JSON `Any`: `{"@type": "type.googleapis.com/google.protobuf.Empty"}`.
pub fn empty_any() -> Value {
    let mut m = Map::new();
    m.insert("@type".into(), Value::String(EMPTY_TYPE.into()));
    Value::Object(m)
}

/// `google.cloud.aiplatform.v1.GenericOperationMetadata`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GenericOperationMetadata {
    /// Partial failures of a batch operation.
    #[serde(alias = "partial_failures", skip_serializing_if = "Vec::is_empty")]
    pub partial_failures: Vec<Status>,
    /// When the operation was created.
    #[serde(alias = "create_time", skip_serializing_if = "Option::is_none")]
    pub create_time: Option<Timestamp>,
    /// When the operation was last updated.
    #[serde(alias = "update_time", skip_serializing_if = "Option::is_none")]
    pub update_time: Option<Timestamp>,
}

/// `google.cloud.aiplatform.v1.DeleteOperationMetadata`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeleteOperationMetadata {
    /// Times of the operation.
    #[serde(alias = "generic_metadata", skip_serializing_if = "Option::is_none")]
    pub generic_metadata: Option<GenericOperationMetadata>,
}

impl DeleteOperationMetadata {
    /// As a JSON `Any`: the fields plus `"@type"`.
    pub fn to_any(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "@type".into(),
            Value::String(DELETE_OPERATION_METADATA_TYPE.into()),
        );
        if let Ok(Value::Object(fields)) = serde_json::to_value(self) {
            m.extend(fields);
        }
        Value::Object(m)
    }

    /// Reads a JSON `Any` holding a `DeleteOperationMetadata`; None for another type.
    pub fn from_any(any: &Value) -> Option<Self> {
        let mut m = any.as_object()?.clone();
        if m.remove("@type")?.as_str()? != DELETE_OPERATION_METADATA_TYPE {
            return None;
        }
        serde_json::from_value(Value::Object(m)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn done_delete_shape() {
        let t0 = Timestamp::parse_rfc3339("2026-11-29T10:00:00Z").expect("t0");
        let t1 = Timestamp::parse_rfc3339("2026-11-29T10:00:01.5Z").expect("t1");
        let op = Operation::done_delete("projects/p/locations/l/operations/9", t0, t1);
        let v = serde_json::to_value(&op).expect("serialise");
        assert_eq!(
            v,
            json!({
                "name": "projects/p/locations/l/operations/9",
                "metadata": {
                    "@type": "type.googleapis.com/google.cloud.aiplatform.v1.DeleteOperationMetadata",
                    "genericMetadata": {
                        "createTime": "2026-11-29T10:00:00Z",
                        "updateTime": "2026-11-29T10:00:01.500Z"
                    }
                },
                "done": true,
                "response": {"@type": "type.googleapis.com/google.protobuf.Empty"}
            })
        );
        let back: Operation = serde_json::from_value(v).expect("parse");
        assert_eq!(back, op);
        let meta = back
            .metadata
            .as_ref()
            .and_then(DeleteOperationMetadata::from_any)
            .expect("meta");
        assert_eq!(meta.generic_metadata.and_then(|g| g.create_time), Some(t0));
    }
}
