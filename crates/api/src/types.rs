//! `CustomJob` and its parts, the well-known `Duration` and `Timestamp`, and
//! `google.rpc.Status`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::error::ApiError;

proto_enum! {
    /// The state of a job (`google.cloud.aiplatform.v1.JobState`).
    pub enum JobState ("google.cloud.aiplatform.v1.JobState") default Unspecified {
        Unspecified = 0 => "JOB_STATE_UNSPECIFIED",
        Queued = 1 => "JOB_STATE_QUEUED",
        Pending = 2 => "JOB_STATE_PENDING",
        Running = 3 => "JOB_STATE_RUNNING",
        Succeeded = 4 => "JOB_STATE_SUCCEEDED",
        Failed = 5 => "JOB_STATE_FAILED",
        Cancelling = 6 => "JOB_STATE_CANCELLING",
        Cancelled = 7 => "JOB_STATE_CANCELLED",
        Paused = 8 => "JOB_STATE_PAUSED",
        Expired = 9 => "JOB_STATE_EXPIRED",
        Updating = 10 => "JOB_STATE_UPDATING",
        PartiallySucceeded = 11 => "JOB_STATE_PARTIALLY_SUCCEEDED",
    }
}

impl JobState {
    /// SUCCEEDED, FAILED, CANCELLED, EXPIRED and PARTIALLY_SUCCEEDED never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Expired
                | JobState::PartiallySucceeded
        )
    }
}

proto_enum! {
    /// Accelerator attached to a machine (`google.cloud.aiplatform.v1.AcceleratorType`).
    pub enum AcceleratorType ("google.cloud.aiplatform.v1.AcceleratorType") default Unspecified {
        Unspecified = 0 => "ACCELERATOR_TYPE_UNSPECIFIED",
        NvidiaTeslaK80 = 1 => "NVIDIA_TESLA_K80",
        NvidiaTeslaP100 = 2 => "NVIDIA_TESLA_P100",
        NvidiaTeslaV100 = 3 => "NVIDIA_TESLA_V100",
        NvidiaTeslaP4 = 4 => "NVIDIA_TESLA_P4",
        NvidiaTeslaT4 = 5 => "NVIDIA_TESLA_T4",
        TpuV2 = 6 => "TPU_V2",
        TpuV3 = 7 => "TPU_V3",
        NvidiaTeslaA100 = 8 => "NVIDIA_TESLA_A100",
        NvidiaA100_80gb = 9 => "NVIDIA_A100_80GB",
        TpuV4Pod = 10 => "TPU_V4_POD",
        NvidiaL4 = 11 => "NVIDIA_L4",
        TpuV5Litepod = 12 => "TPU_V5_LITEPOD",
        NvidiaH100_80gb = 13 => "NVIDIA_H100_80GB",
        NvidiaH100Mega80gb = 14 => "NVIDIA_H100_MEGA_80GB",
        NvidiaH200_141gb = 15 => "NVIDIA_H200_141GB",
        NvidiaB200 = 16 => "NVIDIA_B200",
    }
}

proto_enum! {
    /// Provisioning strategy (`google.cloud.aiplatform.v1.Scheduling.Strategy`).
    pub enum Strategy ("google.cloud.aiplatform.v1.Scheduling.Strategy") default Unspecified {
        Unspecified = 0 => "STRATEGY_UNSPECIFIED",
        OnDemand = 1 => "ON_DEMAND",
        LowCost = 2 => "LOW_COST",
        Standard = 3 => "STANDARD",
        Spot = 4 => "SPOT",
        FlexStart = 6 => "FLEX_START",
    }
}

// ---------------------------------------------------------------------------------------
// Duration

/// Largest magnitude of a `google.protobuf.Duration`, in seconds (about 10 000 years).
pub const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// `google.protobuf.Duration`: `"3600s"`, `"1.5s"`, `"-5s"` on the wire.
///
/// `nanos` has the sign of `seconds` (or `seconds` is 0) and `|nanos| < 1e9`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Duration {
    /// Whole seconds.
    pub seconds: i64,
    /// Fraction of a second in nanoseconds, same sign as `seconds`.
    pub nanos: i32,
}

/// A duration text that is not `<seconds>[.<fraction>]s`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: {reason}")]
pub struct DurationError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Duration {
    /// A whole number of seconds.
    pub fn from_secs(seconds: i64) -> Self {
        Duration { seconds, nanos: 0 }
    }

    /// Milliseconds (may be negative).
    pub fn from_millis(millis: i64) -> Self {
        Duration {
            seconds: millis / 1000,
            nanos: ((millis % 1000) * 1_000_000) as i32,
        }
    }

    /// Converts a `std::time::Duration`; None beyond the proto range.
    pub fn from_std(d: std::time::Duration) -> Option<Self> {
        let seconds = i64::try_from(d.as_secs()).ok()?;
        if seconds > MAX_DURATION_SECONDS {
            return None;
        }
        Some(Duration {
            seconds,
            nanos: d.subsec_nanos() as i32,
        })
    }

    /// True when below zero.
    pub fn is_negative(&self) -> bool {
        self.seconds < 0 || self.nanos < 0
    }

    /// True when exactly zero.
    pub fn is_zero(&self) -> bool {
        self.seconds == 0 && self.nanos == 0
    }

    /// The duration as a `std::time::Duration`; None if negative.
    pub fn as_std(&self) -> Option<std::time::Duration> {
        if self.is_negative() {
            return None;
        }
        let seconds = u64::try_from(self.seconds).ok()?;
        let nanos = u32::try_from(self.nanos).ok()?;
        Some(std::time::Duration::new(seconds, nanos))
    }

    /// Parses `"3600s"`, `"1.5s"`, `"-0.25s"` (up to 9 fractional digits).
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let fail = |reason| DurationError {
            text: text.to_string(),
            reason,
        };
        let body = text.strip_suffix('s').ok_or_else(|| {
            fail("expected a number of seconds with an \"s\" suffix, like \"3600s\" or \"1.5s\"")
        })?;
        let (negative, body) = match body.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        let (int_part, frac_part) = match body.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (body, None),
        };
        let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if !digits_only(int_part) || (int_part.is_empty() && frac_part.is_none_or(str::is_empty)) {
            return Err(fail(
                "expected a number of seconds with an \"s\" suffix, like \"3600s\" or \"1.5s\"",
            ));
        }
        let seconds: i64 = if int_part.is_empty() {
            0
        } else if int_part.len() > 12 {
            return Err(fail("out of range (at most 315576000000 seconds)"));
        } else {
            int_part
                .parse()
                .map_err(|_| fail("invalid number of seconds"))?
        };
        if seconds > MAX_DURATION_SECONDS {
            return Err(fail("out of range (at most 315576000000 seconds)"));
        }
        let nanos: i32 = match frac_part {
            None => 0,
            Some(f) => {
                if f.is_empty() || f.len() > 9 || !digits_only(f) {
                    return Err(fail("the fraction must have 1 to 9 digits"));
                }
                let padded = format!("{f:0<9}");
                padded.parse().map_err(|_| fail("invalid fraction"))?
            }
        };
        Ok(if negative {
            Duration {
                seconds: -seconds,
                nanos: -nanos,
            }
        } else {
            Duration { seconds, nanos }
        })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_negative() {
            f.write_str("-")?;
        }
        write!(f, "{}", self.seconds.unsigned_abs())?;
        if self.nanos != 0 {
            let frac = format!("{:09}", self.nanos.unsigned_abs());
            write!(f, ".{}", frac.trim_end_matches('0'))?;
        }
        f.write_str("s")
    }
}

impl std::str::FromStr for Duration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Duration::parse(s)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string like \"3600s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                Duration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

// ---------------------------------------------------------------------------------------
// Timestamp

/// `google.protobuf.Timestamp`, kept as microseconds since the Unix epoch; RFC 3339 UTC
/// on the wire (`"2026-11-29T10:00:00.123456Z"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp(i64);

/// A timestamp text that is not RFC 3339, or out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid timestamp {text:?}: {reason}")]
pub struct TimestampError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

/// 0001-01-01T00:00:00Z in microseconds since the epoch.
const MIN_TIMESTAMP_MICROS: i64 = -62_135_596_800_000_000;
/// 9999-12-31T23:59:59.999999Z in microseconds since the epoch.
const MAX_TIMESTAMP_MICROS: i64 = 253_402_300_799_999_999;

impl Timestamp {
    /// A timestamp `micros` microseconds after the epoch.
    pub fn from_micros(micros: i64) -> Self {
        Timestamp(micros)
    }

    /// Microseconds since the epoch.
    pub fn micros(&self) -> i64 {
        self.0
    }

    /// The current time (the one place this crate reads the clock; callers that want
    /// virtual time pass their own timestamps).
    pub fn now() -> Self {
        let nanos = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
        Timestamp(i64::try_from(nanos.div_euclid(1000)).unwrap_or(i64::MAX))
    }

    /// RFC 3339 in UTC with `Z`: no fraction for whole seconds, 3 digits for whole
    /// milliseconds, else 6. Values beyond years 0001..=9999 are clamped to that range.
    pub fn to_rfc3339(&self) -> String {
        let micros = self.0.clamp(MIN_TIMESTAMP_MICROS, MAX_TIMESTAMP_MICROS);
        let nanos = i128::from(micros) * 1000;
        let dt = match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(dt) => dt,
            Err(_) => time::OffsetDateTime::UNIX_EPOCH,
        };
        let sub = micros.rem_euclid(1_000_000);
        let frac = if sub == 0 {
            String::new()
        } else if sub % 1000 == 0 {
            format!(".{:03}", sub / 1000)
        } else {
            format!(".{sub:06}")
        };
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{frac}Z",
            dt.year(),
            u8::from(dt.month()),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second()
        )
    }

    /// Parses RFC 3339 with any offset (`Z`, `+09:00`, ...); sub-microsecond digits are
    /// truncated toward the past.
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimestampError> {
        let dt = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .map_err(|e| TimestampError {
                text: text.to_string(),
                reason: format!("{e} (expected RFC 3339, like \"2026-11-29T10:00:00Z\")"),
            })?;
        let micros = dt.unix_timestamp_nanos().div_euclid(1000);
        match i64::try_from(micros) {
            Ok(m) if (MIN_TIMESTAMP_MICROS..=MAX_TIMESTAMP_MICROS).contains(&m) => Ok(Timestamp(m)),
            _ => Err(TimestampError {
                text: text.to_string(),
                reason: "out of range (0001-01-01 to 9999-12-31 UTC)".to_string(),
            }),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl std::str::FromStr for Timestamp {
    type Err = TimestampError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Timestamp::parse_rfc3339(s)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 timestamp string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Timestamp, E> {
                Timestamp::parse_rfc3339(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

// ---------------------------------------------------------------------------------------
// google.rpc.Status

/// `google.rpc.Status`: a job's `error`, an operation's `error`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Status {
    /// Numeric rpc code (3 = INVALID_ARGUMENT, ...).
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(
        with = "crate::json::int32",
        skip_serializing_if = "crate::json::is_zero_i32"
    )]
    pub code: i32,
    /// Developer-facing message.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `google.protobuf.Any` details, kept as JSON.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(with = "Vec<crate::schema::Any>"))]
    pub details: Vec<Value>,
}

impl Status {
    /// A status with a code and a message and no details.
    pub fn new(code: crate::Code, message: impl Into<String>) -> Self {
        Status {
            code: code.number(),
            message: message.into(),
            details: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// CustomJob

/// `google.cloud.aiplatform.v1.CustomJob`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustomJob {
    /// `projects/{p}/locations/{l}/customJobs/{id}` (output only).
    #[serde(skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub name: String,
    /// Required, at most 128 characters.
    #[serde(alias = "display_name", skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// What to run.
    #[serde(alias = "job_spec")]
    pub job_spec: CustomJobSpec,
    /// Output only.
    #[serde(skip_serializing_if = "JobState::is_unspecified")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub state: JobState,
    /// Output only.
    #[serde(alias = "create_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub create_time: Option<Timestamp>,
    /// Output only: first time the job was RUNNING.
    #[serde(alias = "start_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub start_time: Option<Timestamp>,
    /// Output only: when the job became terminal.
    #[serde(alias = "end_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub end_time: Option<Timestamp>,
    /// Output only.
    #[serde(alias = "update_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub update_time: Option<Timestamp>,
    /// Output only: set on FAILED or CANCELLED.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub error: Option<Status>,
    /// User labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Stored and echoed; not honoured locally.
    #[serde(alias = "encryption_spec", skip_serializing_if = "Option::is_none")]
    pub encryption_spec: Option<EncryptionSpec>,
    /// Output only: replica name → interactive shell URI.
    #[serde(alias = "web_access_uris", skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub web_access_uris: BTreeMap<String, String>,
    /// Output only, a Trainyard extension: why a QUEUED or PENDING job waits, in plain
    /// words (the quota metric that is short and by how much, the capacity it lacks, the
    /// stockout backoff it waits out).
    #[serde(alias = "trainyard_waiting_reason", skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub trainyard_waiting_reason: String,
    /// Output only, a Trainyard extension: a RUNNING job's health (hangs and stragglers).
    #[serde(alias = "trainyard_health", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub trainyard_health: Option<TrainyardHealth>,
    /// Output only, a Trainyard extension: a RUNNING job's progress and ETA, from what its
    /// program reports (`$TRAINYARD_PROGRESS_FILE`, or cloudml-hypertune's `global_step`).
    #[serde(alias = "trainyard_progress", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub trainyard_progress: Option<TrainyardProgress>,
    /// Output only, a Trainyard extension: where the job's time went (goodput): wall and
    /// accelerator seconds queued, starting, productive, idle and lost.
    #[serde(alias = "trainyard_goodput", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub trainyard_goodput: Option<TrainyardGoodput>,
    /// A Trainyard extension: directories of the server's host that this job's containers
    /// see read-only at their own paths (`custom-jobs create --config` sends the job
    /// file's directory, so that a container runs the same `train.py` as `local-run`).
    /// Accepted from a server without a tokens file (local clients only), or with a token
    /// the tokens file allows (`host_directories = true`); absolute paths of existing
    /// directories outside the data directory and the storage root.
    #[serde(alias = "trainyard_host_directories", skip_serializing_if = "Vec::is_empty")]
    pub trainyard_host_directories: Vec<String>,
}

impl CustomJob {
    /// Clears the output-only fields (what the service does with them on create).
    pub fn clear_output_only(&mut self) {
        self.name.clear();
        self.state = JobState::Unspecified;
        self.create_time = None;
        self.start_time = None;
        self.end_time = None;
        self.update_time = None;
        self.error = None;
        self.web_access_uris.clear();
        self.trainyard_waiting_reason.clear();
        self.trainyard_health = None;
        self.trainyard_progress = None;
    }
}

/// A Trainyard extension: the step reached (int64 as a string), the total if known, the
/// steps per second over the last minute, and when the total is reached at that rate.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TrainyardProgress {
    pub step: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub total: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<Timestamp>,
}

/// A Trainyard extension: a job's goodput. `goodput` is productive wall time over all its
/// wall time so far; `wallSeconds` and `acceleratorSeconds` (accelerators held times time)
/// split its time: queued (for quota or placement), starting (replicas launched, not all
/// up), productive (running), idle (running while a replica is hung, stopped or
/// (re)starting) and lost (work since the last checkpoint thrown away by a restart, a
/// preemption, an elastic change or a retry, and the shutdown of a failed attempt).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TrainyardGoodput {
    pub goodput: f64,
    pub wall_seconds: GoodputSplit,
    pub accelerator_seconds: GoodputSplit,
}

/// Seconds by bucket (see [`TrainyardGoodput`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GoodputSplit {
    pub queued: f64,
    pub starting: f64,
    pub productive: f64,
    pub idle: f64,
    pub lost: f64,
}

/// A Trainyard extension: `ok`, `straggler` (one replica silent while the others go on)
/// or `hang` (no replica goes on), with the replica and since when.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TrainyardHealth {
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replica: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

/// `google.cloud.aiplatform.v1.EncryptionSpec` (stored, not honoured).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EncryptionSpec {
    /// Cloud KMS key name.
    #[serde(alias = "kms_key_name", skip_serializing_if = "String::is_empty")]
    pub kms_key_name: String,
}

/// `google.cloud.aiplatform.v1.CustomJobSpec`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CustomJobSpec {
    /// Pool 0 primary, 1 workers, 2 parameter servers, 3 evaluators.
    #[serde(alias = "worker_pool_specs", skip_serializing_if = "Vec::is_empty")]
    pub worker_pool_specs: Vec<WorkerPoolSpec>,
    /// Timeout, retries, provisioning strategy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
    /// Stored, not honoured.
    #[serde(alias = "service_account", skip_serializing_if = "String::is_empty")]
    pub service_account: String,
    /// Stored, not honoured.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// Stored, not honoured.
    #[serde(alias = "reserved_ip_ranges", skip_serializing_if = "Vec::is_empty")]
    pub reserved_ip_ranges: Vec<String>,
    /// Stored, not honoured.
    #[serde(
        alias = "enable_web_access",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub enable_web_access: bool,
    /// Where `AIP_MODEL_DIR` and friends point.
    #[serde(
        alias = "base_output_directory",
        skip_serializing_if = "Option::is_none"
    )]
    pub base_output_directory: Option<GcsDestination>,
    /// Stored, not honoured.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tensorboard: String,
    /// Stored, not honoured.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub experiment: String,
    /// Stored, not honoured.
    #[serde(alias = "experiment_run", skip_serializing_if = "String::is_empty")]
    pub experiment_run: String,
    /// Stored, not honoured.
    #[serde(
        alias = "protected_artifact_location_id",
        skip_serializing_if = "String::is_empty"
    )]
    pub protected_artifact_location_id: String,
    /// Stored, not honoured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Stored, not honoured.
    #[serde(
        alias = "enable_dashboard_access",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub enable_dashboard_access: bool,
    /// Stored, not honoured.
    #[serde(
        alias = "persistent_resource_id",
        skip_serializing_if = "String::is_empty"
    )]
    pub persistent_resource_id: String,
    /// Stored, not honoured (`PscInterfaceConfig`, kept as JSON).
    #[serde(
        alias = "psc_interface_config",
        skip_serializing_if = "Option::is_none"
    )]
    pub psc_interface_config: Option<Value>,
}

/// `google.cloud.aiplatform.v1.WorkerPoolSpec`. An empty `{}` pool is a placeholder.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkerPoolSpec {
    /// Machine type and accelerators.
    #[serde(alias = "machine_spec", skip_serializing_if = "Option::is_none")]
    pub machine_spec: Option<MachineSpec>,
    /// int64: a string on output.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "replica_count",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub replica_count: i64,
    /// A container to run.
    #[serde(alias = "container_spec", skip_serializing_if = "Option::is_none")]
    pub container_spec: Option<ContainerSpec>,
    /// A Python package to install and run.
    #[serde(alias = "python_package_spec", skip_serializing_if = "Option::is_none")]
    pub python_package_spec: Option<PythonPackageSpec>,
    /// Boot disk.
    #[serde(alias = "disk_spec", skip_serializing_if = "Option::is_none")]
    pub disk_spec: Option<DiskSpec>,
    /// NFS mounts.
    #[serde(alias = "nfs_mounts", skip_serializing_if = "Vec::is_empty")]
    pub nfs_mounts: Vec<NfsMount>,
}

impl WorkerPoolSpec {
    /// True for a placeholder pool (`{}`): every field at its default.
    pub fn is_empty(&self) -> bool {
        *self == WorkerPoolSpec::default()
    }
}

/// `google.cloud.aiplatform.v1.MachineSpec`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MachineSpec {
    /// `n1-standard-4`, `a2-highgpu-1g`, ...
    #[serde(alias = "machine_type", skip_serializing_if = "String::is_empty")]
    pub machine_type: String,
    /// Accelerator kind; unspecified for none.
    #[serde(
        alias = "accelerator_type",
        skip_serializing_if = "AcceleratorType::is_unspecified"
    )]
    pub accelerator_type: AcceleratorType,
    /// Accelerators per replica.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(
        alias = "accelerator_count",
        with = "crate::json::int32",
        skip_serializing_if = "crate::json::is_zero_i32"
    )]
    pub accelerator_count: i32,
    /// TPU topology, e.g. `2x2`.
    #[serde(alias = "tpu_topology", skip_serializing_if = "String::is_empty")]
    pub tpu_topology: String,
    /// Stored, not honoured (`ReservationAffinity`, kept as JSON).
    #[serde(
        alias = "reservation_affinity",
        skip_serializing_if = "Option::is_none"
    )]
    pub reservation_affinity: Option<Value>,
}

/// `google.cloud.aiplatform.v1.ContainerSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ContainerSpec {
    /// Image to run.
    #[serde(alias = "image_uri", skip_serializing_if = "String::is_empty")]
    pub image_uri: String,
    /// Overrides the image's entrypoint.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// `google.cloud.aiplatform.v1.PythonPackageSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PythonPackageSpec {
    /// Image with the Python runtime.
    #[serde(alias = "executor_image_uri", skip_serializing_if = "String::is_empty")]
    pub executor_image_uri: String,
    /// Packages to install (at least one).
    #[serde(alias = "package_uris", skip_serializing_if = "Vec::is_empty")]
    pub package_uris: Vec<String>,
    /// Module run as `python -m`.
    #[serde(alias = "python_module", skip_serializing_if = "String::is_empty")]
    pub python_module: String,
    /// Arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// `google.cloud.aiplatform.v1.EnvVar`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EnvVar {
    /// A valid identifier.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The value (`$(VAR)` references are not expanded).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// `google.cloud.aiplatform.v1.DiskSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DiskSpec {
    /// `pd-ssd`, `pd-standard`, ...
    #[serde(alias = "boot_disk_type", skip_serializing_if = "String::is_empty")]
    pub boot_disk_type: String,
    /// int32; 0 means the default (100).
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(
        alias = "boot_disk_size_gb",
        with = "crate::json::int32",
        skip_serializing_if = "crate::json::is_zero_i32"
    )]
    pub boot_disk_size_gb: i32,
}

/// `google.cloud.aiplatform.v1.NfsMount`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NfsMount {
    /// NFS server address.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub server: String,
    /// Exported path on the server.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Mounted under `/mnt/nfs/<mountPoint>`.
    #[serde(alias = "mount_point", skip_serializing_if = "String::is_empty")]
    pub mount_point: String,
}

/// `google.cloud.aiplatform.v1.Scheduling`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Scheduling {
    /// Default 7 days.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Any replica restart retries the whole job.
    #[serde(
        alias = "restart_job_on_worker_restart",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub restart_job_on_worker_restart: bool,
    /// Provisioning strategy.
    #[serde(skip_serializing_if = "Strategy::is_unspecified")]
    pub strategy: Strategy,
    /// No job retries at all.
    #[serde(
        alias = "disable_retries",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub disable_retries: bool,
    /// FLEX_START only: default 24 h, 0 waits forever.
    #[serde(alias = "max_wait_duration", skip_serializing_if = "Option::is_none")]
    pub max_wait_duration: Option<Duration>,
}

/// `google.cloud.aiplatform.v1.GcsDestination`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GcsDestination {
    /// `gs://bucket/dir`, `file:///dir` or `/dir`.
    #[serde(alias = "output_uri_prefix", skip_serializing_if = "String::is_empty")]
    pub output_uri_prefix: String,
}

/// Answer of `customJobs.list`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListCustomJobsResponse {
    /// The page.
    #[serde(alias = "custom_jobs", skip_serializing_if = "Vec::is_empty")]
    pub custom_jobs: Vec<CustomJob>,
    /// Absent on the last page.
    #[serde(alias = "next_page_token", skip_serializing_if = "String::is_empty")]
    pub next_page_token: String,
}

/// Parses a create-CustomJob request body with the service's error text, and clears
/// the output-only fields (`name`, `state`, times, `error`, `webAccessUris`).
///
/// Does not validate: see [`crate::validate::validate_custom_job`].
pub fn parse_custom_job(body: &[u8]) -> Result<CustomJob, ApiError> {
    let mut job: CustomJob = crate::json::from_body(body, "custom_job")?;
    job.clear_output_only();
    Ok(job)
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Duration {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        "google.protobuf.Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": crate::schema::DURATION_PATTERN,
            "description": "A google.protobuf.Duration: seconds with up to 9 fractional digits and an \"s\" suffix, e.g. \"3600s\" or \"1.5s\".",
        })
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Timestamp {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        "google.protobuf.Timestamp".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "description": "A google.protobuf.Timestamp in RFC 3339, UTC, e.g. \"2026-11-29T10:00:00.123Z\".",
        })
    }
}

impl ApiError {
    /// As a `google.rpc.Status` (numeric rpc code), e.g. for a job's `error` field.
    pub fn to_status(&self) -> Status {
        Status { code: self.code.number(), message: self.message.clone(), details: self.details.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_parse_and_print() {
        let cases = [
            ("3600s", 3600, 0, "3600s"),
            ("1.5s", 1, 500_000_000, "1.5s"),
            ("-5s", -5, 0, "-5s"),
            ("-1.25s", -1, -250_000_000, "-1.25s"),
            ("0s", 0, 0, "0s"),
            ("0.000000001s", 0, 1, "0.000000001s"),
            ("1.500s", 1, 500_000_000, "1.5s"),
            (".5s", 0, 500_000_000, "0.5s"),
            ("-0.5s", 0, -500_000_000, "-0.5s"),
            ("315576000000s", 315_576_000_000, 0, "315576000000s"),
        ];
        for (text, s, n, out) in cases {
            let d = Duration::parse(text).expect(text);
            assert_eq!((d.seconds, d.nanos), (s, n), "{text}");
            assert_eq!(d.to_string(), out, "{text}");
        }
    }

    #[test]
    fn duration_rejects_bad_text_naming_it() {
        for bad in [
            "",
            "s",
            "5",
            "5m",
            "1.s",
            "1.0000000001s",
            "abc",
            "1e3s",
            "--1s",
            " 1s",
            "+1s",
            "315576000001s",
            "99999999999999999999s",
            "1.-5s",
        ] {
            let err = Duration::parse(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn duration_std_conversions() {
        assert_eq!(
            Duration::from_secs(7).as_std(),
            Some(std::time::Duration::from_secs(7))
        );
        assert_eq!(Duration::parse("-5s").ok().and_then(|d| d.as_std()), None);
        assert!(Duration::parse("-0.1s")
            .map(|d| d.is_negative())
            .unwrap_or(false));
        assert!(!Duration::from_secs(0).is_negative());
        assert_eq!(
            Duration::from_millis(1500),
            Duration {
                seconds: 1,
                nanos: 500_000_000
            }
        );
        assert_eq!(
            Duration::from_std(std::time::Duration::from_millis(2500)),
            Some(Duration {
                seconds: 2,
                nanos: 500_000_000
            })
        );
    }

    #[test]
    fn timestamp_round_trip() {
        let t = Timestamp::parse_rfc3339("2026-11-29T10:00:00.123456Z").expect("parse");
        assert_eq!(t.to_rfc3339(), "2026-11-29T10:00:00.123456Z");
        let t2 = Timestamp::from_micros(t.micros());
        assert_eq!(t, t2);
        assert_eq!(
            Timestamp::from_micros(0).to_rfc3339(),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(
            Timestamp::from_micros(1_500_000).to_rfc3339(),
            "1970-01-01T00:00:01.500Z"
        );
        assert_eq!(
            Timestamp::from_micros(-1).to_rfc3339(),
            "1969-12-31T23:59:59.999999Z"
        );
    }

    #[test]
    fn timestamp_offsets_and_precision() {
        let a = Timestamp::parse_rfc3339("2026-11-29T19:00:00+09:00").expect("offset");
        let b = Timestamp::parse_rfc3339("2026-11-29T10:00:00Z").expect("z");
        assert_eq!(a, b);
        let lower = Timestamp::parse_rfc3339("2026-11-29t10:00:00z").expect("lowercase");
        assert_eq!(lower, b);
        // RFC 3339 allows a space instead of the `T`.
        let spaced = Timestamp::parse_rfc3339("2026-11-29 10:00:00Z").expect("space");
        assert_eq!(spaced, b);
        // Nanoseconds are truncated to microseconds.
        let n = Timestamp::parse_rfc3339("2026-11-29T10:00:00.123456789Z").expect("nanos");
        assert_eq!(n.to_rfc3339(), "2026-11-29T10:00:00.123456Z");
        let neg = Timestamp::parse_rfc3339("1969-12-31T23:59:59.9999999Z").expect("neg");
        assert_eq!(neg.micros(), -1);
        let min = Timestamp::parse_rfc3339("0001-01-01T00:00:00Z").expect("min");
        assert_eq!(min.to_rfc3339(), "0001-01-01T00:00:00Z");
        let max = Timestamp::parse_rfc3339("9999-12-31T23:59:59.999999Z").expect("max");
        assert_eq!(max.to_rfc3339(), "9999-12-31T23:59:59.999999Z");
        // Clamped, never a panic.
        assert_eq!(
            Timestamp::from_micros(i64::MAX).to_rfc3339(),
            "9999-12-31T23:59:59.999999Z"
        );
        assert_eq!(
            Timestamp::from_micros(i64::MIN).to_rfc3339(),
            "0001-01-01T00:00:00Z"
        );
    }

    #[test]
    fn timestamp_rejects_bad_text_naming_it() {
        for bad in [
            "",
            "2026-11-29",
            "2026-11-29T10:00:00",
            "2026-13-01T00:00:00Z",
            "yesterday",
            "2026-02-30T00:00:00Z",
        ] {
            let err = Timestamp::parse_rfc3339(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn enums_by_name_and_number() {
        assert_eq!(
            JobState::from_name("JOB_STATE_RUNNING"),
            Ok(JobState::Running)
        );
        assert_eq!(JobState::from_number(11), Ok(JobState::PartiallySucceeded));
        assert_eq!(JobState::Running.number(), 3);
        assert_eq!(AcceleratorType::NvidiaTeslaT4.name(), "NVIDIA_TESLA_T4");
        assert_eq!(Strategy::from_number(6), Ok(Strategy::FlexStart));
        let err = Strategy::from_number(5).expect_err("5 is not a strategy");
        assert!(err.to_string().contains('5'), "{err}");
        let err = JobState::from_name("RUNNING").expect_err("not a name");
        assert!(err.to_string().contains("\"RUNNING\""), "{err}");
        assert_eq!("3".parse::<JobState>(), Ok(JobState::Running));
        for e in AcceleratorType::ALL {
            assert_eq!(AcceleratorType::from_name(e.name()), Ok(*e));
            assert_eq!(AcceleratorType::from_number(e.number()), Ok(*e));
        }
    }
}
