//! The API's schemas as one OpenAPI components table (feature `schema`): every resource
//! and message the server prints, from the wire types of the modules below.

/// The schemas of the API's resources and messages, generated from the wire types with
/// schemars' OpenAPI 3.0 settings in the serialisation (output) contract, keyed by name.
///
/// References between them are `#/components/schemas/<name>`. The transforms of the
/// OpenAPI 3.0 settings have been applied (`nullable` instead of `"null"` types, no
/// boolean schemas, no `const`); a caller embedding them may still want to check for
/// keywords its dialect rejects.
pub fn component_schemas() -> serde_json::Map<String, serde_json::Value> {
    use crate::hptuning::{HyperparameterTuningJob, ListHyperparameterTuningJobsResponse};
    use crate::operation::{DeleteOperationMetadata, GenericOperationMetadata, Operation};
    use crate::types::{CustomJob, ListCustomJobsResponse, Status};

    let mut generator = schemars::generate::SchemaSettings::openapi3()
        .for_serialize()
        .with(|s| s.meta_schema = None)
        .into_generator();
    generator.subschema_for::<CustomJob>();
    generator.subschema_for::<ListCustomJobsResponse>();
    generator.subschema_for::<Operation>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOperationMetadata>();
    generator.subschema_for::<GenericOperationMetadata>();
    generator.subschema_for::<HyperparameterTuningJob>();
    generator.subschema_for::<crate::pipeline::TrainingPipeline>();
    generator.subschema_for::<crate::pipeline::ListTrainingPipelinesResponse>();
    generator.subschema_for::<ListHyperparameterTuningJobsResponse>();
    generator.subschema_for::<crate::vizier::Study>();
    generator.subschema_for::<crate::vizier::ListStudiesResponse>();
    generator.subschema_for::<crate::vizier::LookupStudyRequest>();
    generator.subschema_for::<crate::vizier::SuggestTrialsRequest>();
    generator.subschema_for::<crate::vizier::SuggestTrialsResponse>();
    generator.subschema_for::<crate::vizier::SuggestTrialsMetadata>();
    generator.subschema_for::<crate::vizier::AddTrialMeasurementRequest>();
    generator.subschema_for::<crate::vizier::CompleteTrialRequest>();
    generator.subschema_for::<crate::vizier::NameOnlyRequest>();
    generator.subschema_for::<crate::vizier::CheckTrialEarlyStoppingStateResponse>();
    generator.subschema_for::<crate::vizier::CheckTrialEarlyStoppingStateMetatdata>();
    generator.subschema_for::<crate::vizier::ListTrialsResponse>();
    generator.subschema_for::<crate::vizier::ListOptimalTrialsResponse>();
    generator.subschema_for::<crate::hptuning::Trial>();
    generator.take_definitions(true)
}
