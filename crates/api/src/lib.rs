//! Wire types of the managed-training REST API (`v1`) that Trainyard speaks, with the
//! proto3-JSON rules of that API and the structural validation done at create.
//!
//! - [`json`]: proto3-JSON helpers (int64 as strings, lenient int32/double input, body
//!   parsing with the service's own error text).
//! - [`types`]: `CustomJob` and its parts, `Duration`, `Timestamp`, `Status`.
//! - [`hptuning`]: `HyperparameterTuningJob`, `StudySpec`, `Trial`.
//! - [`imageref`]: container image references (`[domain/]path[:tag][@digest]`).
//! - [`operation`]: long-running `Operation` and its metadata.
//! - [`vizier`]: the Vizier service's `Study` and its request and response messages.
//! - [`error`]: [`ApiError`] and the rpc [`Code`]s.
//! - [`validate`]: structural checks at create (catalog checks live elsewhere).
//! - [`enum_int`]: `enum-encoding=int`, enum names of a printed resource as numbers.
//! - `schema` (feature `schema`): JSON Schema (schemars) of the wire forms, and
//!   `components`: the schemas of every resource and message, for OpenAPI.
//!
//! Every resource struct denies unknown fields, accepts both lowerCamelCase and
//! snake_case names on input and prints lowerCamelCase, omitting fields at their default.
//! Fields that Trainyard cannot honour (network, encryptionSpec, ...) are kept and echoed.

/// Defines a proto enum with its wire names and numbers.
///
/// The enum serialises as its NAME and deserialises from the NAME, the number (JSON
/// number or numeric string) or `null` (the default value).
macro_rules! proto_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($proto:literal) default $default:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $num:literal => $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(i32)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $num, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The full proto name of the enum type.
            pub const PROTO_NAME: &'static str = $proto;

            /// The wire name, e.g. `"JOB_STATE_RUNNING"`.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $wire,)+ }
            }

            /// The proto number.
            pub fn number(self) -> i32 {
                self as i32
            }

            /// The value with this wire name.
            pub fn from_name(name: &str) -> Result<Self, $crate::json::UnknownEnumValue> {
                match name {
                    $($wire => Ok($name::$variant),)+
                    _ => Err($crate::json::UnknownEnumValue::new($proto, name)),
                }
            }

            /// The value with this proto number.
            pub fn from_number(number: i32) -> Result<Self, $crate::json::UnknownEnumValue> {
                match number {
                    $($num => Ok($name::$variant),)+
                    _ => Err($crate::json::UnknownEnumValue::new($proto, number)),
                }
            }

            /// Parses a wire name or a decimal number.
            pub fn parse(text: &str) -> Result<Self, $crate::json::UnknownEnumValue> {
                match Self::from_name(text) {
                    Ok(v) => Ok(v),
                    Err(e) => match text.trim().parse::<i32>() {
                        Ok(n) => Self::from_number(n),
                        Err(_) => Err(e),
                    },
                }
            }

            /// True for the default (`*_UNSPECIFIED`, number 0) value.
            pub fn is_unspecified(&self) -> bool {
                *self == $name::$default
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::json::UnknownEnumValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl $crate::json::ProtoEnum for $name {
            const PROTO_NAME: &'static str = $proto;
            fn name(self) -> &'static str { $name::name(self) }
            fn number(self) -> i32 { $name::number(self) }
            fn from_name(name: &str) -> Result<Self, $crate::json::UnknownEnumValue> {
                $name::from_name(name)
            }
            fn from_number(number: i32) -> Result<Self, $crate::json::UnknownEnumValue> {
                $name::from_number(number)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::json::deserialize_enum::<D, $name>(d)
            }
        }

        #[cfg(feature = "schema")]
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($name))
            }
            fn schema_id() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed($proto)
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                $crate::schema::proto_enum_schema($proto, vec![$($wire),+])
            }
        }
    };
}

#[cfg(feature = "schema")]
pub mod components;
pub mod enum_int;
pub mod error;
pub mod exec;
pub mod hptuning;
pub mod imageref;
pub mod json;
pub mod operation;
pub mod pipeline;
#[cfg(feature = "schema")]
pub mod schema;
pub mod types;
pub mod validate;
pub mod vizier;

pub use error::{ApiError, Code};
pub use hptuning::{
    parse_hyperparameter_tuning_job, Algorithm, CategoricalValueCondition, CategoricalValueSpec,
    ConditionalParameterSpec, ConvexAutomatedStoppingSpec, DecayCurveAutomatedStoppingSpec,
    DiscreteValueCondition, DiscreteValueSpec, DoubleValueSpec, GoalType, HyperparameterTuningJob,
    IntValueCondition, IntegerValueSpec, ListHyperparameterTuningJobsResponse, Measurement,
    MeasurementMetric, MeasurementSelectionType, MedianAutomatedStoppingSpec, MetricSpec,
    ObservationNoise, ParameterSpec, SafetyMetricConfig, ScaleType, StudySpec, Trial,
    TrialParameter, TrialState,
};
pub use imageref::{parse_image_reference, ImageRefError, ImageReference};
pub use enum_int::encode_enums_as_int;
pub use json::{ProtoEnum, UnknownEnumValue};
pub use pipeline::{
    parse_training_pipeline, pipeline_custom_job, validate_training_pipeline, ListTrainingPipelinesResponse, PipelineState,
    TrainingPipeline, CUSTOM_TASK_DEFINITION,
};
pub use operation::{DeleteOperationMetadata, GenericOperationMetadata, Operation};
pub use types::{
    parse_custom_job, AcceleratorType, ContainerSpec, CustomJob, CustomJobSpec, DiskSpec, Duration,
    DurationError, EncryptionSpec, EnvVar, GcsDestination, JobState, ListCustomJobsResponse,
    MachineSpec, NfsMount, PythonPackageSpec, Scheduling, Status, Strategy, Timestamp,
    TimestampError, WorkerPoolSpec,
};
pub use validate::{validate_custom_job, validate_hyperparameter_tuning_job, validate_study_spec};
pub use vizier::{parse_study, Study, StudyState};
