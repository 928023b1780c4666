//! `$alt=json;enum-encoding=int`: enum names of a printed resource as their numbers.

use serde_json::Value;

use crate::json::ProtoEnum;


/// Rewrites enum names as numbers in a serialised resource, for the query option
/// `$alt=json;enum-encoding=int`.
///
/// Knows the enum-valued keys of this API: `state` (a `JobState`, or a `Trial.State`
/// for the elements of `trials`), `acceleratorType`, `strategy`, `goal`, `scaleType`,
/// `algorithm`, `measurementSelectionType` and `observationNoise`. Free-form parts
/// (`labels`, `webAccessUris`, `details`, parameter `value`s) are left alone, and a string
/// that is not a name of the expected enum is kept as is.
pub fn encode_enums_as_int(value: &mut Value) {
    walk_enums(value, false);
}

fn walk_enums(value: &mut Value, is_trial: bool) {
    use crate::hptuning::{
        Algorithm, GoalType, MeasurementSelectionType, ObservationNoise, ScaleType, TrialState,
    };
    use crate::types::{AcceleratorType, JobState, Strategy};

    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match key.as_str() {
                    "labels"
                    | "webAccessUris"
                    | "details"
                    | "value"
                    | "metadata"
                    | "response"
                    | "reservationAffinity"
                    | "studyStoppingConfig"
                    | "trainingTaskInputs"
                    | "trainingTaskMetadata" => {}
                    "state" if child.as_str().is_some_and(|s| s.starts_with("PIPELINE_STATE_")) => {
                        to_number::<crate::pipeline::PipelineState>(child)
                    }
                    "state" if is_trial => to_number::<TrialState>(child),
                    "state" => to_number::<JobState>(child),
                    "acceleratorType" => to_number::<AcceleratorType>(child),
                    "strategy" => to_number::<Strategy>(child),
                    "goal" => to_number::<GoalType>(child),
                    "scaleType" => to_number::<ScaleType>(child),
                    "algorithm" => to_number::<Algorithm>(child),
                    "measurementSelectionType" => to_number::<MeasurementSelectionType>(child),
                    "observationNoise" => to_number::<ObservationNoise>(child),
                    "trials" => {
                        if let Value::Array(items) = child {
                            for item in items {
                                walk_enums(item, true);
                            }
                        }
                    }
                    _ => walk_enums(child, false),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                walk_enums(item, false);
            }
        }
        _ => {}
    }
}

fn to_number<E: ProtoEnum>(value: &mut Value) {
    if let Value::String(name) = value {
        if let Ok(e) = E::from_name(name) {
            *value = Value::from(e.number());
        }
    }
}
