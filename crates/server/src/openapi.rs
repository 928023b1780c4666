//! The OpenAPI 3.0.3 document of the REST API, served at `/openapi.json`.
//!
//! The component schemas of the resources (`CustomJob` and its parts, `Operation`,
//! `Status`, `HyperparameterTuningJob`, ...) are generated from the wire types of
//! `trainyard-api` (feature `schema`), so they follow the serde attributes: lowerCamelCase
//! names, int64 as decimal strings, enums by name, `Duration` as `"3600s"`, `Timestamp`
//! in RFC 3339. They describe the OUTPUT form; the server is more lenient on input
//! (snake_case names, numbers for int64 and enums, `null` for defaults).
//!
//! Only the paths, parameters and responses are written here, following the routes of
//! [`crate::http::router`].

use serde_json::{json, Map, Value};

/// Prefix of component schema references in OpenAPI 3.0.
const COMPONENTS: &str = "#/components/schemas/";

/// Error statuses every operation may answer with.
const ERROR_STATUSES: &[(u16, &str)] = &[
    (400, "INVALID_ARGUMENT, FAILED_PRECONDITION or OUT_OF_RANGE: the request is invalid, or the resource is not in a state that allows it."),
    (401, "UNAUTHENTICATED: no token, or an unknown one (when the server has a tokens file)."),
    (403, "PERMISSION_DENIED: the token may not use this project, or is read-only and the request writes."),
    (404, "NOT_FOUND: the resource, the method or the URL does not exist."),
    (405, "The HTTP method is not allowed on this resource (status UNIMPLEMENTED)."),
    (409, "ALREADY_EXISTS or ABORTED: a conflict."),
    (413, "The request body is larger than the limit of 1 MiB (status OUT_OF_RANGE)."),
    (429, "RESOURCE_EXHAUSTED: a quota or a limit is exhausted."),
    (500, "INTERNAL, UNKNOWN or DATA_LOSS: an error of the server."),
    (501, "UNIMPLEMENTED: the method or option is not supported by this server."),
    (503, "UNAVAILABLE: the server is shutting down or cannot answer now."),
];

/// The OpenAPI 3.0.3 document.
pub fn document() -> Value {
    let mut schemas = Map::new();
    for (name, mut schema) in trainyard_api::components::component_schemas() {
        to_openapi30(&mut schema);
        schemas.insert(name, schema);
    }
    // `jobSpec` is always printed, but a list with `readMask` prints only the listed
    // fields: no field of a CustomJob is required.
    if let Some(Value::Object(job)) = schemas.get_mut("CustomJob") {
        job.remove("required");
    }
    schemas.insert("Error".into(), error_schema());
    schemas.insert("LogEntry".into(), log_entry_schema());
    schemas.insert(
        "Empty".into(),
        json!({
            "type": "object",
            "description": "An empty message (google.protobuf.Empty): `{}`.",
            "additionalProperties": false,
        }),
    );

    let mut responses = Map::new();
    for &(code, description) in ERROR_STATUSES {
        responses.insert(
            error_response_name(code),
            json!({
                "description": description,
                "content": {"application/json": {"schema": schema_ref("Error")}},
            }),
        );
    }

    let jobs = "/v1/projects/{project}/locations/{location}/customJobs";
    let mut paths = Map::new();
    paths.insert(jobs.to_string(), json!({
        "parameters": [param_ref("project"), param_ref("location")],
        "get": operation(
            "projects.locations.customJobs.list",
            "Lists CustomJobs",
            "Lists the CustomJobs of a location, newest first, filtered by `filter`. With `readMask`, every job holds only the listed fields.",
            vec![param_ref("alt"), param_ref("pageSize"), param_ref("pageToken"), param_ref("filter"), param_ref("readMask")],
            None,
            ok_json("ListCustomJobsResponse", "A page of CustomJobs; `nextPageToken` is absent on the last page."),
        ),
        "post": operation(
            "projects.locations.customJobs.create",
            "Creates a CustomJob",
            "Creates a CustomJob; it starts at once. Output-only fields of the body are ignored. The body is `application/json` (a missing Content-Type is accepted), at most 1 MiB.",
            vec![param_ref("alt")],
            Some(json!({
                "required": true,
                "description": "The CustomJob to create.",
                "content": {"application/json": {"schema": schema_ref("CustomJob")}},
            })),
            ok_json("CustomJob", "The created CustomJob."),
        ),
    }));
    paths.insert(format!("{jobs}/{{customJob}}"), json!({
        "parameters": [param_ref("project"), param_ref("location"), param_ref("customJob")],
        "get": operation(
            "projects.locations.customJobs.get",
            "Gets a CustomJob",
            "Gets a CustomJob.",
            vec![param_ref("alt")],
            None,
            ok_json("CustomJob", "The CustomJob."),
        ),
        "delete": operation(
            "projects.locations.customJobs.delete",
            "Deletes a CustomJob",
            "Deletes a CustomJob in a terminal state (otherwise 400 FAILED_PRECONDITION), with its logs; files under `baseOutputDirectory` stay. Answers with a finished long-running operation.",
            vec![param_ref("alt")],
            None,
            ok_json("Operation", "A done Operation: `DeleteOperationMetadata` metadata and an `Empty` response."),
        ),
    }));
    paths.insert(format!("{jobs}/{{customJob}}:cancel"), json!({
        "parameters": [param_ref("project"), param_ref("location"), param_ref("customJob")],
        "post": operation(
            "projects.locations.customJobs.cancel",
            "Cancels a CustomJob",
            "Asks a CustomJob to stop; it goes through JOB_STATE_CANCELLING to JOB_STATE_CANCELLED. Cancelling a job in a terminal state is an error.",
            vec![param_ref("alt")],
            Some(json!({
                "required": false,
                "description": "An empty object (the request has no fields).",
                "content": {"application/json": {"schema": schema_ref("Empty")}},
            })),
            ok_json("Empty", "Empty: the cancellation was requested."),
        ),
    }));
    paths.insert(format!("{jobs}/{{customJob}}/logs"), json!({
        "parameters": [param_ref("project"), param_ref("location"), param_ref("customJob")],
        "get": operation(
            "projects.locations.customJobs.logs",
            "Reads the log of a CustomJob (Trainyard extension)",
            "The job's log: every replica's stdout and stderr for every attempt and restart, with the service's lifecycle events, as newline-delimited JSON (one `LogEntry` per line) ordered by time. With `follow=true` the stream goes on until the job is in a terminal state.",
            vec![param_ref("follow"), param_ref("replica"), param_ref("attempt")],
            None,
            json!({
                "description": "Newline-delimited JSON: one LogEntry object per line.",
                "content": {"application/x-ndjson": {"schema": schema_ref("LogEntry")}},
            }),
        ),
    }));
    paths.insert(
        "/v1/projects/{project}/locations/{location}/operations/{operation}".into(),
        json!({
            "parameters": [param_ref("project"), param_ref("location"), param_ref("operation")],
            "get": operation(
                "projects.locations.operations.get",
                "Gets a long-running operation",
                "Gets a long-running operation, e.g. the one answered by a delete.",
                vec![param_ref("alt")],
                None,
                ok_json("Operation", "The Operation."),
            ),
        }),
    );
    vizier_paths(&mut paths);
    paths.insert(
        "/healthz".into(),
        json!({
            "get": {
                "operationId": "healthz",
                "summary": "Liveness check",
                "tags": ["service"],
                "responses": {"200": {
                    "description": "The server is up.",
                    "content": {"text/plain": {"schema": {"type": "string", "enum": ["ok"]}}},
                }},
            },
        }),
    );
    paths.insert(
        "/metrics".into(),
        json!({
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "description": "The Prometheus text format 0.0.4, or OpenMetrics when the Accept header asks for application/openmetrics-text. No token needed.",
                "tags": ["service"],
                "responses": {"200": {
                    "description": "The metrics.",
                    "content": {
                        "text/plain": {"schema": {"type": "string"}},
                        "application/openmetrics-text": {"schema": {"type": "string"}},
                    },
                }},
            },
        }),
    );
    paths.insert(
        "/openapi.json".into(),
        json!({
            "get": {
                "operationId": "openapi",
                "summary": "This OpenAPI document",
                "tags": ["service"],
                "responses": {"200": {
                    "description": "The OpenAPI 3.0.3 document of the API.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }},
            },
        }),
    );

    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Trainyard API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A local implementation of the Vertex AI v1 REST API for CustomJobs (`google.cloud.aiplatform.v1`), with proto3 JSON: lowerCamelCase names, int64 values as decimal strings, enums by name, durations like \"3600s\", timestamps in RFC 3339. Schemas describe the output form; on input the server also accepts snake_case names, numbers for int64 and enum values and `null` for defaults. With `$alt=json;enum-encoding=int` enums are printed as numbers instead of names. Every error is `{\"error\": {\"code\", \"message\", \"status\"}}`.",
            "license": {"name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"},
        },
        "servers": [{"url": "/"}],
        "tags": [
            {"name": "customJobs", "description": "CustomJob resources."},
            {"name": "operations", "description": "Long-running operations."},
            {"name": "studies", "description": "Vizier studies and their trials (`google.cloud.aiplatform.v1.VizierService`)."},
            {"name": "service", "description": "The server itself."},
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "parameters": parameters(),
            "responses": responses,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token of the server's tokens file, as `Authorization: Bearer TOKEN`. Without a tokens file the server is open (loopback only). No or an unknown token: 401; a project the token may not use, or a write with a read-only token: 403.",
                },
            },
        },
    })
}

/// The Vizier API's paths (`projects.locations.studies` and `.studies.trials`), as
/// `crate::http::vizier` routes them.
fn vizier_paths(paths: &mut Map<String, Value>) {
    let studies = "/v1/projects/{project}/locations/{location}/studies";
    let study = format!("{studies}/{{study}}");
    let trials = format!("{study}/trials");
    let trial = format!("{trials}/{{trial}}");
    let body = |schema: &str, description: &str| {
        Some(json!({
            "required": true,
            "description": description,
            "content": {"application/json": {"schema": schema_ref(schema)}},
        }))
    };
    let at = |extra: &[&str]| {
        let mut v = vec![param_ref("project"), param_ref("location")];
        v.extend(extra.iter().map(|p| param_ref(p)));
        Value::Array(v)
    };
    let alt = || vec![param_ref("alt")];
    let page = || vec![param_ref("alt"), param_ref("studyPageSize"), param_ref("pageToken")];
    paths.insert(studies.to_string(), json!({
        "parameters": at(&[]),
        "get": operation("projects.locations.studies.list", "Lists Studies", "Lists the Vizier studies of a location, newest first.", page(), None,
            ok_json("ListStudiesResponse", "A page of Studies; `nextPageToken` is absent on the last page.")),
        "post": operation("projects.locations.studies.create", "Creates a Study",
            "Creates a Vizier study. Its `studySpec` is checked as a HyperparameterTuningJob's (400 naming the field); `displayName` is unique in the location (409 ALREADY_EXISTS). `studySpec.studyStoppingConfig.maxNumTrials` bounds the trials it suggests.",
            alt(), body("Study", "The Study to create."), ok_json("Study", "The created Study (ACTIVE).")),
    }));
    paths.insert(format!("{studies}:lookup"), json!({
        "parameters": at(&[]),
        "post": operation("projects.locations.studies.lookup", "Looks a Study up by its display name", "The study of the location with `displayName`, or 404.",
            alt(), body("LookupStudyRequest", "`displayName` (required)."), ok_json("Study", "The Study.")),
    }));
    paths.insert(study.clone(), json!({
        "parameters": at(&["study"]),
        "get": operation("projects.locations.studies.get", "Gets a Study", "Gets a Study.", alt(), None, ok_json("Study", "The Study.")),
        "delete": operation("projects.locations.studies.delete", "Deletes a Study", "Deletes a Study with its trials, whatever its state; a suggestion being computed is answered with an ABORTED error.",
            alt(), None, ok_json("Empty", "Empty.")),
    }));
    paths.insert(format!("{study}/operations/{{operation}}"), json!({
        "parameters": at(&["study", "operation"]),
        "get": operation("projects.locations.studies.operations.get", "Gets a suggest operation", "A `trials:suggest` Operation of the study.", alt(), None, ok_json("Operation", "The Operation.")),
    }));
    paths.insert(trials.clone(), json!({
        "parameters": at(&["study"]),
        "get": operation("projects.locations.studies.trials.list", "Lists Trials", "The study's trials by id.", page(), None,
            ok_json("ListTrialsResponse", "A page of Trials; `nextPageToken` is absent on the last page.")),
        "post": operation("projects.locations.studies.trials.create", "Creates a Trial",
            "Adds a trial with the client's `parameters` (a whole point of the search space, 400 naming the parameter otherwise). With a `finalMeasurement` it is SUCCEEDED at once; else it is REQUESTED and the next suggestion hands it out.",
            alt(), body("Trial", "The Trial: `parameters`, and optionally `measurements` and `finalMeasurement`."), ok_json("Trial", "The created Trial.")),
    }));
    paths.insert(format!("{trials}:suggest"), json!({
        "parameters": at(&["study"]),
        "post": operation("projects.locations.studies.trials.suggest", "Suggests Trials",
            "Asks the study's optimiser for `suggestionCount` trials (1 to 100) for `clientId`. A client that has trials it has not completed gets them again. Answered with a long-running Operation (`SuggestTrialsMetadata`), done with a `SuggestTrialsResponse` once the trials exist: the answer waits up to 10 s for that, else the client polls `operations/{operation}`.",
            alt(), body("SuggestTrialsRequest", "`suggestionCount`, `clientId`, optional `contexts`."), ok_json("Operation", "The suggest Operation.")),
    }));
    paths.insert(format!("{trials}:listOptimalTrials"), json!({
        "parameters": at(&["study"]),
        "post": operation("projects.locations.studies.trials.listOptimalTrials", "Lists the optimal Trials",
            "The SUCCEEDED trials no other trial beats: the trials tied for the best value with one objective, the Pareto front with several.",
            alt(), body("NameOnlyRequest", "An empty object (or `parent`)."), ok_json("ListOptimalTrialsResponse", "The optimal Trials.")),
    }));
    paths.insert(trial.clone(), json!({
        "parameters": at(&["study", "trial"]),
        "get": operation("projects.locations.studies.trials.get", "Gets a Trial", "Gets a Trial.", alt(), None, ok_json("Trial", "The Trial.")),
        "delete": operation("projects.locations.studies.trials.delete", "Deletes a Trial", "Deletes a Trial; its id is not given again.", alt(), None, ok_json("Empty", "Empty.")),
    }));
    let verb = |name: &str, summary: &str, description: &str, request: &str, ok: Value| {
        json!({
            "parameters": at(&["study", "trial"]),
            "post": operation(&format!("projects.locations.studies.trials.{name}"), summary, description, alt(), body(request, "The request."), ok),
        })
    };
    paths.insert(format!("{trial}:addTrialMeasurement"), verb("addTrialMeasurement", "Adds a measurement to a Trial",
        "Adds an intermediate measurement to a trial that has not ended (400 FAILED_PRECONDITION otherwise); metric values must be finite.",
        "AddTrialMeasurementRequest", ok_json("Trial", "The Trial.")));
    paths.insert(format!("{trial}:complete"), verb("complete", "Completes a Trial",
        "Ends a trial: SUCCEEDED with `finalMeasurement` (which must hold every objective metric) or with one of its measurements chosen by the study's `measurementSelectionType`, INFEASIBLE with `trialInfeasible` or when no measurement has the objectives. A trial that has ended: 400 FAILED_PRECONDITION.",
        "CompleteTrialRequest", ok_json("Trial", "The Trial.")));
    paths.insert(format!("{trial}:stop"), verb("stop", "Stops a Trial", "Marks a trial that has not ended STOPPING: its client should complete it.",
        "NameOnlyRequest", ok_json("Trial", "The Trial.")));
    paths.insert(format!("{trial}:checkTrialEarlyStoppingState"), verb("checkTrialEarlyStoppingState", "Checks whether a Trial should stop",
        "Applies the study's automated stopping rule (median or decay curve) to the trial's measurements; a trial it stops becomes STOPPING. Answered with a done Operation whose `CheckTrialEarlyStoppingStateResponse` says `shouldStop`.",
        "NameOnlyRequest", ok_json("Operation", "The done Operation.")));
    paths.insert(format!("{trial}/operations/{{operation}}"), json!({
        "parameters": at(&["study", "trial", "operation"]),
        "get": operation("projects.locations.studies.trials.operations.get", "Gets an early-stopping operation", "A `:checkTrialEarlyStoppingState` Operation of the trial.", alt(), None, ok_json("Operation", "The Operation.")),
    }));
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("{COMPONENTS}{name}")})
}

fn param_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/parameters/{name}")})
}

fn error_response_name(code: u16) -> String {
    format!("Error{code}")
}

fn ok_json(schema: &str, description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": schema_ref(schema)}},
    })
}

fn operation(
    id: &str,
    summary: &str,
    description: &str,
    parameters: Vec<Value>,
    body: Option<Value>,
    ok: Value,
) -> Value {
    let mut responses = Map::new();
    responses.insert("200".into(), ok);
    for &(code, _) in ERROR_STATUSES {
        responses.insert(
            code.to_string(),
            json!({"$ref": format!("#/components/responses/{}", error_response_name(code))}),
        );
    }
    let tag = if id.contains(".operations.") {
        "operations"
    } else if id.contains(".studies.") {
        "studies"
    } else {
        "customJobs"
    };
    let mut op = Map::new();
    op.insert("operationId".into(), json!(id));
    op.insert("summary".into(), json!(summary));
    op.insert("description".into(), json!(description));
    op.insert("tags".into(), json!([tag]));
    // A bearer token when the server has a tokens file; none in open (loopback) mode.
    op.insert("security".into(), json!([{"bearerAuth": []}, {}]));
    if !parameters.is_empty() {
        op.insert("parameters".into(), Value::Array(parameters));
    }
    if let Some(body) = body {
        op.insert("requestBody".into(), body);
    }
    op.insert("responses".into(), Value::Object(responses));
    Value::Object(op)
}

fn parameters() -> Value {
    let path = |name: &str, description: &str, pattern: Option<&str>| {
        let mut schema = json!({"type": "string"});
        if let Some(p) = pattern {
            schema["pattern"] = json!(p);
        }
        json!({"name": name, "in": "path", "required": true, "description": description, "schema": schema})
    };
    json!({
        "project": path("project", "The project id (any non-empty segment).", None),
        "location": path("location", "The location (region), e.g. `us-central1`.", None),
        "customJob": path("customJob", "The CustomJob id: a decimal number.", Some("^[0-9]{1,18}$")),
        "operation": path("operation", "The operation id: a decimal number.", Some("^[0-9]{1,18}$")),
        "study": path("study", "The Study id: a decimal number.", Some("^[0-9]{1,18}$")),
        "trial": path("trial", "The Trial id within its study: a decimal number.", Some("^[0-9]{1,18}$")),
        "studyPageSize": {
            "name": "pageSize",
            "in": "query",
            "required": false,
            "description": "Items per page: 0 or absent for 100, at most 1000 (larger values are lowered). Negative values are refused.",
            "schema": {"type": "integer", "format": "int32", "minimum": 0},
        },
        "alt": {
            "name": "$alt",
            "in": "query",
            "required": false,
            "description": "Response encoding: `json` (enums by name, the default) or `json;enum-encoding=int` (enums as numbers; the response then differs from the schemas, which show names).",
            "schema": {"type": "string", "enum": ["json", "json;enum-encoding=int"], "default": "json"},
        },
        "pageSize": {
            "name": "pageSize",
            "in": "query",
            "required": false,
            "description": "Jobs per page: 0 or absent for 100, at most 1000 (larger values are lowered). Negative values are refused.",
            "schema": {"type": "integer", "format": "int32", "minimum": 0},
        },
        "pageToken": {
            "name": "pageToken",
            "in": "query",
            "required": false,
            "description": "The `nextPageToken` of the previous page of the same query.",
            "schema": {"type": "string"},
        },
        "filter": {
            "name": "filter",
            "in": "query",
            "required": false,
            "description": "An AIP-160 filter. Fields: `display_name`, `state`, `create_time`, `update_time`, `labels.KEY` (or their camelCase spellings). Operators: `=`, `!=`, `<`, `>`, `<=`, `>=`, `:` (has); `AND`, `OR`, `NOT` (or `-`), parentheses; quoted strings; RFC 3339 times; `*` as a wildcard in `display_name` and label values compared with `=`. An invalid filter is answered with 400 naming the column. Example: `state=JOB_STATE_RUNNING AND labels.team=ml`.",
            "schema": {"type": "string"},
        },
        "readMask": {
            "name": "readMask",
            "in": "query",
            "required": false,
            "description": "A field mask: comma-separated field paths (camelCase or snake_case, dotted for nested fields). Every listed job holds only these fields.",
            "schema": {"type": "string"},
            "example": "name,displayName,state",
        },
        "follow": {
            "name": "follow",
            "in": "query",
            "required": false,
            "description": "Keep the stream open and send new entries until the job is in a terminal state.",
            "schema": {"type": "boolean", "default": false},
        },
        "replica": {
            "name": "replica",
            "in": "query",
            "required": false,
            "description": "Only the entries of this replica (e.g. `workerpool0-0`, or `service` for lifecycle events).",
            "schema": {"type": "string"},
        },
        "attempt": {
            "name": "attempt",
            "in": "query",
            "required": false,
            "description": "Only the entries of this attempt of the job.",
            "schema": {"type": "integer", "format": "int32", "minimum": 0, "maximum": u32::MAX},
        },
    })
}

/// The error body of every failure: `{"error": {"code", "message", "status", "details"}}`.
fn error_schema() -> Value {
    let statuses: Vec<&str> = trainyard_api::Code::ALL.iter().map(|c| c.name()).collect();
    json!({
        "type": "object",
        "description": "An error answer (AIP-193).",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "status"],
                "properties": {
                    "code": {"type": "integer", "format": "int32", "description": "The HTTP status of the answer."},
                    "message": {"type": "string", "description": "What went wrong, naming the field when there is one."},
                    "status": {"type": "string", "enum": statuses, "description": "The google.rpc.Code name."},
                    "details": {
                        "type": "array",
                        "description": "google.protobuf.Any details (ErrorInfo, BadRequest, ...), when there are some.",
                        "items": {
                            "type": "object",
                            "properties": {"@type": {"type": "string"}},
                            "additionalProperties": true,
                        },
                    },
                },
                "additionalProperties": false,
            },
        },
        "additionalProperties": false,
    })
}

/// One line of the logs stream ([`crate::logs::Entry`]).
fn log_entry_schema() -> Value {
    json!({
        "type": "object",
        "description": "One entry of a job's log (one line of the application/x-ndjson stream).",
        "required": ["time", "attempt", "replica", "restart", "stream", "text"],
        "properties": {
            "time": {"type": "string", "format": "date-time", "description": "When the line was read, RFC 3339 UTC."},
            "attempt": {"type": "integer", "format": "int32", "minimum": 0, "description": "Attempt of the job (retries start new attempts)."},
            "replica": {"type": "string", "description": "The replica's name, or `service` for lifecycle events."},
            "restart": {"type": "integer", "format": "int32", "minimum": 0, "description": "Restart of the replica within the attempt."},
            "stream": {"type": "string", "enum": ["stdout", "stderr", "event"]},
            "text": {"type": "string", "description": "The line, without its newline."},
            "rule": {"type": "string", "pattern": "^L[0-9]{1,2}[a-z]?$", "description": "For a lifecycle event: the rule of the lifecycle that made it (`L11`), which its text cites first."},
        },
        "additionalProperties": false,
    })
}

// ---------------------------------------------------------------------------------------
// JSON Schema (draft 2020-12 / draft-07) → OpenAPI 3.0 Schema Object

/// Keywords of later JSON Schema drafts that an OpenAPI 3.0 Schema Object does not have
/// and that carry no meaning worth keeping for these types.
const DROPPED_KEYWORDS: &[&str] = &["$schema", "$id", "$comment", "$anchor", "$defs", "definitions"];

/// Rewrites a generated schema (and its subschemas) into an OpenAPI 3.0 Schema Object:
/// references to `#/$defs/X` or `#/definitions/X` become `#/components/schemas/X`,
/// `"null"` types become `nullable`, `const` becomes a one-value `enum`, `examples` an
/// `example`, boolean schemas objects, and a `$ref` with siblings an `allOf`.
pub fn to_openapi30(schema: &mut Value) {
    match schema {
        Value::Bool(true) => *schema = json!({}),
        Value::Bool(false) => *schema = json!({"not": {}}),
        Value::Object(obj) => {
            rewrite_object(obj);
            if obj.contains_key("$ref") && obj.len() > 1 {
                let r = obj.remove("$ref").unwrap_or(Value::Null);
                let all_of = obj.entry("allOf").or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(items) = all_of {
                    items.insert(0, json!({"$ref": r}));
                }
            }
        }
        _ => {}
    }
}

fn is_null_schema(v: &Value) -> bool {
    match v {
        Value::Object(o) => {
            o.get("type") == Some(&json!("null"))
                || o.get("const") == Some(&Value::Null) && !o.contains_key("type")
                || o.get("enum") == Some(&json!([null]))
        }
        _ => false,
    }
}

fn rewrite_object(obj: &mut Map<String, Value>) {
    for k in DROPPED_KEYWORDS {
        obj.remove(*k);
    }
    if let Some(Value::String(r)) = obj.get_mut("$ref") {
        for prefix in ["#/$defs/", "#/definitions/"] {
            if let Some(name) = r.strip_prefix(prefix) {
                *r = format!("{COMPONENTS}{name}");
            }
        }
    }
    // `type: [T, "null"]` → `type: T, nullable: true`.
    if let Some(Value::Array(types)) = obj.get("type").cloned() {
        let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if non_null.len() < types.len() {
            obj.insert("nullable".into(), json!(true));
        }
        match non_null.len() {
            0 => {
                obj.remove("type");
            }
            1 => {
                obj.insert("type".into(), non_null[0].clone());
            }
            _ => {
                obj.remove("type");
                let alts: Vec<Value> = non_null.into_iter().map(|t| json!({"type": t})).collect();
                obj.insert("anyOf".into(), Value::Array(alts));
            }
        }
    }
    if obj.get("type") == Some(&json!("null")) {
        obj.remove("type");
        obj.insert("nullable".into(), json!(true));
        obj.insert("enum".into(), json!([null]));
    }
    // `anyOf: [X, null]` (an `Option` of a referenced type) → X, nullable.
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = obj.get(key).cloned() {
            let rest: Vec<Value> = alts.iter().filter(|a| !is_null_schema(a)).cloned().collect();
            if rest.len() < alts.len() {
                obj.insert("nullable".into(), json!(true));
                if rest.len() == 1 {
                    obj.remove(key);
                    obj.insert("allOf".into(), Value::Array(rest));
                } else {
                    obj.insert(key.into(), Value::Array(rest));
                }
            }
        }
    }
    if let Some(c) = obj.remove("const") {
        obj.insert("enum".into(), json!([c]));
    }
    if let Some(Value::Array(mut examples)) = obj.remove("examples") {
        if !examples.is_empty() && !obj.contains_key("example") {
            obj.insert("example".into(), examples.swap_remove(0));
        }
    }
    if let Some(Value::Number(n)) = obj.get("exclusiveMinimum").cloned() {
        obj.insert("minimum".into(), Value::Number(n));
        obj.insert("exclusiveMinimum".into(), json!(true));
    }
    if let Some(Value::Number(n)) = obj.get("exclusiveMaximum").cloned() {
        obj.insert("maximum".into(), Value::Number(n));
        obj.insert("exclusiveMaximum".into(), json!(true));
    }
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for v in props.values_mut() {
            to_openapi30(v);
        }
    }
    if let Some(ap) = obj.get_mut("additionalProperties") {
        if !ap.is_boolean() {
            to_openapi30(ap);
        }
    }
    for key in ["items", "not"] {
        if let Some(v) = obj.get_mut(key) {
            to_openapi30(v);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(items)) = obj.get_mut(key) {
            for v in items {
                to_openapi30(v);
            }
        }
    }
    // An `allOf` of one reference with nothing else: the reference itself.
    if obj.len() == 1 {
        if let Some(Value::Array(items)) = obj.get("allOf") {
            if items.len() == 1 && items[0].get("$ref").is_some() && items[0].as_object().is_some_and(|o| o.len() == 1)
            {
                let r = items[0].clone();
                obj.clear();
                if let Value::Object(m) = r {
                    obj.extend(m);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use trainyard_api::{
        ContainerSpec, CustomJob, CustomJobSpec, DiskSpec, Duration, EnvVar, GcsDestination, JobState,
        ListCustomJobsResponse, MachineSpec, Operation, Scheduling, Status, Strategy, Timestamp, WorkerPoolSpec,
    };

    /// Keywords of JSON Schema that the OpenAPI 3.0 Schema Object does not have.
    const NOT_OPENAPI30: &[&str] = &[
        "$schema",
        "$id",
        "$defs",
        "definitions",
        "const",
        "examples",
        "prefixItems",
        "contains",
        "if",
        "then",
        "else",
        "patternProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$anchor",
        "$comment",
    ];

    /// Walks every schema of `v` (at `path`), calling `f` on each.
    fn walk_schemas(v: &Value, path: &str, f: &mut dyn FnMut(&str, &Map<String, Value>)) {
        let Some(obj) = v.as_object() else {
            panic!("{path}: a schema must be an object in OpenAPI 3.0, got {v}");
        };
        f(path, obj);
        if let Some(Value::Object(props)) = obj.get("properties") {
            for (k, s) in props {
                walk_schemas(s, &format!("{path}.properties.{k}"), f);
            }
        }
        if let Some(ap) = obj.get("additionalProperties") {
            if !ap.is_boolean() {
                walk_schemas(ap, &format!("{path}.additionalProperties"), f);
            }
        }
        for key in ["items", "not"] {
            if let Some(s) = obj.get(key) {
                walk_schemas(s, &format!("{path}.{key}"), f);
            }
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(items)) = obj.get(key) {
                for (i, s) in items.iter().enumerate() {
                    walk_schemas(s, &format!("{path}.{key}[{i}]"), f);
                }
            }
        }
    }

    /// Every `$ref` string anywhere in `v`.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "$ref" {
                        out.push(x.as_str().unwrap_or_default().to_string());
                    } else {
                        refs(x, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    fn sample_job() -> CustomJob {
        let t = |s: &str| Timestamp::parse_rfc3339(s).expect("timestamp");
        CustomJob {
            name: "projects/p/locations/us-central1/customJobs/42".into(),
            display_name: "train".into(),
            job_spec: CustomJobSpec {
                worker_pool_specs: vec![
                    WorkerPoolSpec {
                        machine_spec: Some(MachineSpec {
                            machine_type: "n1-standard-4".into(),
                            accelerator_type: trainyard_api::AcceleratorType::NvidiaTeslaT4,
                            accelerator_count: 1,
                            ..Default::default()
                        }),
                        replica_count: 1,
                        container_spec: Some(ContainerSpec {
                            image_uri: "python:3.12".into(),
                            command: vec!["python".into(), "-c".into()],
                            args: vec!["print(1)".into()],
                            env: vec![EnvVar {
                                name: "A".into(),
                                value: "1".into(),
                            }],
                        }),
                        disk_spec: Some(DiskSpec {
                            boot_disk_type: "pd-ssd".into(),
                            boot_disk_size_gb: 100,
                        }),
                        ..Default::default()
                    },
                    WorkerPoolSpec::default(),
                ],
                scheduling: Some(Scheduling {
                    timeout: Some(Duration::parse("3600s").expect("duration")),
                    strategy: Strategy::Spot,
                    max_wait_duration: Some(Duration::parse("1.5s").expect("duration")),
                    ..Default::default()
                }),
                base_output_directory: Some(GcsDestination {
                    output_uri_prefix: "/tmp/out".into(),
                }),
                reserved_ip_ranges: vec!["r".into()],
                psc_interface_config: Some(json!({"networkAttachment": "x"})),
                ..Default::default()
            },
            state: JobState::Failed,
            create_time: Some(t("2026-11-29T10:00:00Z")),
            start_time: Some(t("2026-11-29T10:00:01.500Z")),
            end_time: Some(t("2026-11-29T10:00:02.123456Z")),
            update_time: Some(t("2026-11-29T10:00:02.123456Z")),
            error: Some(Status {
                code: 3,
                message: "replica workerpool0-0 exited with status 1".into(),
                details: vec![json!({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "X"})],
            }),
            labels: BTreeMap::from([("team".to_string(), "ml".to_string())]),
            web_access_uris: BTreeMap::from([("workerpool0-0".to_string(), "http://x".to_string())]),
            ..Default::default()
        }
    }

    /// Writes the document and sample instances to `$TRAINYARD_OPENAPI_OUT` (a directory),
    /// for external validators.
    fn dump(doc: &Value, samples: &[(&str, &str, Value)]) {
        let Some(dir) = std::env::var_os("TRAINYARD_OPENAPI_OUT") else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("out dir");
        std::fs::write(
            dir.join("openapi.json"),
            serde_json::to_string_pretty(doc).expect("json"),
        )
        .expect("write");
        let samples: Vec<Value> = samples
            .iter()
            .map(|(file, schema, v)| json!({"name": file, "schema": schema, "instance": v}))
            .collect();
        std::fs::write(
            dir.join("samples.json"),
            serde_json::to_string_pretty(&samples).expect("json"),
        )
        .expect("write");
    }

    #[test]
    fn openapi_document_is_openapi30_and_complete() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.0.3");
        assert_eq!(doc["servers"], json!([{"url": "/"}]));
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for name in [
            "CustomJob",
            "CustomJobSpec",
            "WorkerPoolSpec",
            "MachineSpec",
            "ContainerSpec",
            "PythonPackageSpec",
            "EnvVar",
            "DiskSpec",
            "NfsMount",
            "Scheduling",
            "GcsDestination",
            "EncryptionSpec",
            "Status",
            "ListCustomJobsResponse",
            "Operation",
            "JobState",
            "AcceleratorType",
            "Strategy",
            "HyperparameterTuningJob",
            "StudySpec",
            "Trial",
            "Error",
            "LogEntry",
            "Empty",
        ] {
            assert!(schemas.contains_key(name), "missing component schema {name}");
        }

        // Every reference resolves, and only to components.
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in &all {
            let mut node = &doc;
            let ptr = r.strip_prefix("#/").unwrap_or_else(|| panic!("non-local $ref {r}"));
            assert!(ptr.starts_with("components/"), "{r}");
            for part in ptr.split('/') {
                node = node.get(part).unwrap_or_else(|| panic!("dangling $ref {r}"));
            }
        }

        // Nothing OpenAPI 3.0 rejects.
        for (name, s) in schemas {
            walk_schemas(s, name, &mut |path, obj| {
                for k in NOT_OPENAPI30 {
                    assert!(!obj.contains_key(*k), "{path} has {k}");
                }
                if let Some(t) = obj.get("type") {
                    assert!(t.is_string() && t != "null", "{path}: type {t}");
                }
                if obj.contains_key("$ref") {
                    assert_eq!(obj.len(), 1, "{path}: $ref with siblings");
                }
                for k in ["exclusiveMinimum", "exclusiveMaximum", "nullable", "readOnly"] {
                    if let Some(v) = obj.get(k) {
                        assert!(v.is_boolean(), "{path}.{k} = {v}");
                    }
                }
            });
        }

        // The custom serde forms.
        let wps = &schemas["WorkerPoolSpec"]["properties"];
        assert_eq!(wps["replicaCount"]["type"], "string");
        assert_eq!(wps["replicaCount"]["pattern"], "^-?[0-9]+$");
        assert_eq!(
            schemas["MachineSpec"]["properties"]["acceleratorCount"]["type"],
            "integer"
        );
        let timeout = &schemas["Scheduling"]["properties"]["timeout"];
        assert_eq!(timeout["pattern"], r"^-?[0-9]+(\.[0-9]{1,9})?s$");
        let create_time = &schemas["CustomJob"]["properties"]["createTime"];
        assert_eq!(create_time["format"], "date-time");
        assert_eq!(create_time["readOnly"], true);
        let states = schemas["JobState"]["enum"].as_array().expect("enum");
        assert!(states.contains(&json!("JOB_STATE_RUNNING")));
        assert_eq!(states.len(), JobState::ALL.len());
        assert_eq!(schemas["CustomJob"]["additionalProperties"], false);
        assert!(
            schemas["CustomJob"].get("required").is_none(),
            "readMask prints partial jobs"
        );
        assert!(schemas["CustomJob"]["properties"].get("job_spec").is_none());

        // Every route of http.rs.
        let paths = doc["paths"].as_object().expect("paths");
        let jobs = "/v1/projects/{project}/locations/{location}/customJobs";
        let expect = [
            (jobs.to_string(), vec!["get", "post"]),
            (format!("{jobs}/{{customJob}}"), vec!["get", "delete"]),
            (format!("{jobs}/{{customJob}}:cancel"), vec!["post"]),
            (format!("{jobs}/{{customJob}}/logs"), vec!["get"]),
            (
                "/v1/projects/{project}/locations/{location}/operations/{operation}".to_string(),
                vec!["get"],
            ),
            ("/healthz".to_string(), vec!["get"]),
            ("/metrics".to_string(), vec!["get"]),
        ];
        let studies = "/v1/projects/{project}/locations/{location}/studies";
        let vizier = [
            (studies.to_string(), vec!["get", "post"]),
            (format!("{studies}:lookup"), vec!["post"]),
            (format!("{studies}/{{study}}"), vec!["get", "delete"]),
            (format!("{studies}/{{study}}/operations/{{operation}}"), vec!["get"]),
            (format!("{studies}/{{study}}/trials"), vec!["get", "post"]),
            (format!("{studies}/{{study}}/trials:suggest"), vec!["post"]),
            (format!("{studies}/{{study}}/trials:listOptimalTrials"), vec!["post"]),
            (format!("{studies}/{{study}}/trials/{{trial}}"), vec!["get", "delete"]),
            (format!("{studies}/{{study}}/trials/{{trial}}:addTrialMeasurement"), vec!["post"]),
            (format!("{studies}/{{study}}/trials/{{trial}}:complete"), vec!["post"]),
            (format!("{studies}/{{study}}/trials/{{trial}}:stop"), vec!["post"]),
            (format!("{studies}/{{study}}/trials/{{trial}}:checkTrialEarlyStoppingState"), vec!["post"]),
            (format!("{studies}/{{study}}/trials/{{trial}}/operations/{{operation}}"), vec!["get"]),
        ];
        let expect: Vec<(String, Vec<&str>)> = expect.into_iter().chain(vizier).collect();
        for (path, methods) in &expect {
            for m in methods {
                assert!(paths[path.as_str()].get(*m).is_some(), "{m} {path}");
            }
        }
        let logs = &paths[&format!("{jobs}/{{customJob}}/logs")]["get"]["responses"]["200"]["content"];
        assert!(logs.get("application/x-ndjson").is_some());
        for code in [
            "400", "401", "403", "404", "405", "409", "413", "429", "500", "501", "503",
        ] {
            assert!(paths[jobs]["post"]["responses"].get(code).is_some(), "{code}");
        }

        // Sample outputs of the server, for the external validators.
        let job = sample_job();
        let job_json = serde_json::to_value(&job).expect("job");
        assert_eq!(job_json["jobSpec"]["workerPoolSpecs"][0]["replicaCount"], "1");
        let list = ListCustomJobsResponse {
            custom_jobs: vec![job.clone(), CustomJob::default()],
            next_page_token: "2a.00".into(),
        };
        let t0 = Timestamp::parse_rfc3339("2026-11-29T10:00:00Z").expect("t0");
        let op = Operation::done_delete("projects/p/locations/l/operations/9", t0, t0);
        let err = trainyard_api::ApiError::invalid_argument("bad").with_detail(json!({"@type": "x"}));
        let entry = crate::logs::Entry {
            time: "2026-11-29T10:00:00.000001Z".into(),
            attempt: 1,
            replica: "workerpool0-0".into(),
            restart: 0,
            stream: "stdout".into(),
            text: "hello".into(),
            rule: Some("L11".into()),
            micros: 0,
        };
        let entry_json = serde_json::to_value(&entry).expect("entry");
        let keys: Vec<&String> = entry_json.as_object().expect("entry").keys().collect();
        let props: Vec<&String> = schemas["LogEntry"]["properties"]
            .as_object()
            .expect("props")
            .keys()
            .collect();
        assert_eq!(keys, props, "LogEntry schema out of date with logs::Entry");
        dump(
            &doc,
            &[
                ("custom_job", "CustomJob", job_json),
                (
                    "custom_job_empty",
                    "CustomJob",
                    serde_json::to_value(CustomJob::default()).expect("json"),
                ),
                (
                    "list",
                    "ListCustomJobsResponse",
                    serde_json::to_value(&list).expect("json"),
                ),
                ("operation", "Operation", serde_json::to_value(&op).expect("json")),
                ("error", "Error", err.to_json()),
                ("log_entry", "LogEntry", entry_json),
            ],
        );
    }

    #[test]
    fn openapi_conversion_of_draft_keywords() {
        let mut s = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "a": {"type": ["string", "null"]},
                "b": {"$ref": "#/$defs/B", "description": "x"},
                "c": {"anyOf": [{"$ref": "#/definitions/C"}, {"type": "null"}]},
                "d": {"const": "k"},
                "e": true,
                "f": {"type": "integer", "exclusiveMinimum": 0},
            },
        });
        to_openapi30(&mut s);
        assert_eq!(s.get("$schema"), None);
        let p = &s["properties"];
        assert_eq!(p["a"], json!({"type": "string", "nullable": true}));
        assert_eq!(
            p["b"],
            json!({"allOf": [{"$ref": "#/components/schemas/B"}], "description": "x"})
        );
        assert_eq!(
            p["c"],
            json!({"allOf": [{"$ref": "#/components/schemas/C"}], "nullable": true})
        );
        assert_eq!(p["d"], json!({"enum": ["k"]}));
        assert_eq!(p["e"], json!({}));
        assert_eq!(
            p["f"],
            json!({"type": "integer", "minimum": 0, "exclusiveMinimum": true})
        );
    }
}
