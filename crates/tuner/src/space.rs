//! The search space: parameters, scales, conditional children, and its
//! validation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::TunerError;

/// How a numeric parameter's range is mapped onto the unit interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scale {
    /// `u = (x - min) / (max - min)`.
    #[default]
    Linear,
    /// `u = (ln x - ln min) / (ln max - ln min)`; needs `min > 0`.
    /// Spreads resolution towards the bottom of the range.
    Log,
    /// `u = 1 - (ln(max + min - x) - ln min) / (ln max - ln min)`; needs
    /// `min > 0`. Spreads resolution towards the top of the range.
    ReverseLog,
}

impl Scale {
    fn is_log(self) -> bool {
        matches!(self, Scale::Log | Scale::ReverseLog)
    }

    /// Maps `x` in `[lo, hi]` to `[0, 1]`.
    pub(crate) fn to_unit(self, x: f64, lo: f64, hi: f64) -> f64 {
        if hi <= lo {
            return 0.5;
        }
        let x = x.clamp(lo, hi);
        let u = match self {
            Scale::Linear => (x - lo) / (hi - lo),
            Scale::Log => (x.ln() - lo.ln()) / (hi.ln() - lo.ln()),
            Scale::ReverseLog => 1.0 - ((hi + lo - x).ln() - lo.ln()) / (hi.ln() - lo.ln()),
        };
        u.clamp(0.0, 1.0)
    }

    /// Maps `u` in `[0, 1]` back to `[lo, hi]`.
    pub(crate) fn at_unit(self, u: f64, lo: f64, hi: f64) -> f64 {
        if hi <= lo {
            return lo;
        }
        let u = u.clamp(0.0, 1.0);
        let x = match self {
            Scale::Linear => lo + u * (hi - lo),
            Scale::Log => (lo.ln() + u * (hi.ln() - lo.ln())).exp(),
            Scale::ReverseLog => hi + lo - (lo.ln() + (1.0 - u) * (hi.ln() - lo.ln())).exp(),
        };
        x.clamp(lo, hi)
    }
}

/// Whether the objective is to be maximised or minimised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    Maximize,
    Minimize,
}

impl Goal {
    /// `true` when `a` is strictly better than `b` under this goal.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Goal::Maximize => a > b,
            Goal::Minimize => a < b,
        }
    }

    /// The value as something to maximise.
    pub(crate) fn to_max(self, v: f64) -> f64 {
        match self {
            Goal::Maximize => v,
            Goal::Minimize => -v,
        }
    }
}

/// A parameter value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Double(f64),
    Int(i64),
    Str(String),
}

impl Value {
    /// The value as a number (integers widen), `None` for strings.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Double(x) => Some(*x),
            Value::Int(i) => Some(*i as f64),
            Value::Str(_) => None,
        }
    }

    /// The value as an integer: an `Int`, or a `Double` with no fraction.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Double(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Some(*x as i64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Double(x) => write!(f, "{x}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Str(s) => f.write_str(s),
        }
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Double(x)
    }
}
impl From<i64> for Value {
    fn from(x: i64) -> Self {
        Value::Int(x)
    }
}
impl From<&str> for Value {
    fn from(x: &str) -> Self {
        Value::Str(x.to_string())
    }
}
impl From<String> for Value {
    fn from(x: String) -> Self {
        Value::Str(x)
    }
}

/// Parameter id → value. Only parameters that are active (top-level ones,
/// and conditional ones whose parent takes one of their parent values) appear.
pub type Assignment = BTreeMap<String, Value>;

/// The domain of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamKind {
    Double {
        min: f64,
        max: f64,
        scale: Scale,
    },
    Integer {
        min: i64,
        max: i64,
        scale: Scale,
    },
    /// A finite set of numbers; the scale shapes the geometry the Bayesian
    /// optimiser sees.
    Discrete {
        values: Vec<f64>,
        scale: Scale,
    },
    Categorical {
        values: Vec<String>,
    },
}

/// The parent values under which a conditional parameter is active; the
/// variant must match the parent's kind (discrete, integer, categorical).
#[derive(Clone, Debug, PartialEq)]
pub enum ParentValues {
    Discrete(Vec<f64>),
    Int(Vec<i64>),
    Categorical(Vec<String>),
}

impl ParentValues {
    /// Whether the parent's value activates the child.
    pub(crate) fn matches(&self, v: &Value) -> bool {
        match self {
            ParentValues::Discrete(vals) => match v.as_f64() {
                Some(x) => vals.contains(&x),
                None => false,
            },
            ParentValues::Int(vals) => match v.as_i64() {
                Some(x) => vals.contains(&x),
                None => false,
            },
            ParentValues::Categorical(vals) => match v.as_str() {
                Some(s) => vals.iter().any(|p| p == s),
                None => false,
            },
        }
    }
}

/// A conditional child parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Conditional {
    pub parent_values: ParentValues,
    pub spec: ParamSpec,
}

/// One parameter: id, domain, optional default, conditional children.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub id: String,
    pub kind: ParamKind,
    /// A starting point: the Bayesian optimiser's first suggestion of a study
    /// uses the defaults that are given.
    pub default: Option<Value>,
    pub children: Vec<Conditional>,
}

impl ParamSpec {
    pub fn new(id: impl Into<String>, kind: ParamKind) -> Self {
        ParamSpec {
            id: id.into(),
            kind,
            default: None,
            children: Vec::new(),
        }
    }
    pub fn double(id: impl Into<String>, min: f64, max: f64, scale: Scale) -> Self {
        Self::new(id, ParamKind::Double { min, max, scale })
    }
    pub fn integer(id: impl Into<String>, min: i64, max: i64, scale: Scale) -> Self {
        Self::new(id, ParamKind::Integer { min, max, scale })
    }
    pub fn discrete(id: impl Into<String>, values: Vec<f64>, scale: Scale) -> Self {
        Self::new(id, ParamKind::Discrete { values, scale })
    }
    pub fn categorical<S: Into<String>>(
        id: impl Into<String>,
        values: impl IntoIterator<Item = S>,
    ) -> Self {
        Self::new(
            id,
            ParamKind::Categorical {
                values: values.into_iter().map(Into::into).collect(),
            },
        )
    }
    /// Sets the default value.
    pub fn with_default(mut self, v: impl Into<Value>) -> Self {
        self.default = Some(v.into());
        self
    }
    /// Adds a conditional child, active when this parameter takes one of
    /// `parent_values`.
    pub fn with_child(mut self, parent_values: ParentValues, spec: ParamSpec) -> Self {
        self.children.push(Conditional {
            parent_values,
            spec,
        });
        self
    }

    /// Whether `v` lies in this parameter's domain.
    pub(crate) fn contains(&self, v: &Value) -> bool {
        match &self.kind {
            ParamKind::Double { min, max, .. } => {
                matches!(v.as_f64(), Some(x) if x >= *min && x <= *max)
            }
            ParamKind::Integer { min, max, .. } => {
                matches!(v.as_i64(), Some(x) if x >= *min && x <= *max)
            }
            ParamKind::Discrete { values, .. } => {
                matches!(v.as_f64(), Some(x) if values.contains(&x))
            }
            ParamKind::Categorical { values } => {
                matches!(v.as_str(), Some(s) if values.iter().any(|p| p == s))
            }
        }
    }
}

/// The search space: the top-level parameters, in order.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Space {
    pub params: Vec<ParamSpec>,
}

impl Space {
    pub fn new(params: Vec<ParamSpec>) -> Self {
        Space { params }
    }

    /// Checks the space and reports the first problem, naming the parameter:
    /// an empty or duplicate id, a non-finite bound, `min` above `max`, a log
    /// or reverse-log scale with a bound `<= 0`, an empty (or repeated-value)
    /// categorical or discrete list, a default outside the domain,
    /// conditional children under a DOUBLE parent, parent values of the wrong
    /// kind, or parent values that the parent cannot take.
    pub fn validate(&self) -> Result<(), TunerError> {
        let mut ids = BTreeSet::new();
        for p in &self.params {
            validate_param(p, &mut ids)?;
        }
        Ok(())
    }

    /// All parameters, parents before their children (pre-order).
    pub(crate) fn flatten(&self) -> Vec<FlatParam<'_>> {
        let mut out = Vec::new();
        for p in &self.params {
            flatten_into(p, None, &mut out);
        }
        out
    }
}

fn invalid(param: &str, message: impl Into<String>) -> TunerError {
    TunerError::InvalidSpace {
        param: param.to_string(),
        message: message.into(),
    }
}

fn validate_param(p: &ParamSpec, ids: &mut BTreeSet<String>) -> Result<(), TunerError> {
    if p.id.is_empty() {
        return Err(invalid("", "parameter id is empty"));
    }
    if !ids.insert(p.id.clone()) {
        return Err(invalid(&p.id, format!("duplicate parameter id {:?}", p.id)));
    }
    let id = p.id.as_str();
    match &p.kind {
        ParamKind::Double { min, max, scale } => {
            if !min.is_finite() || !max.is_finite() {
                return Err(invalid(
                    id,
                    format!("bounds must be finite (min {min}, max {max})"),
                ));
            }
            if min > max {
                return Err(invalid(id, format!("min {min} is above max {max}")));
            }
            if scale.is_log() && *min <= 0.0 {
                return Err(invalid(
                    id,
                    format!("{scale:?} scale needs positive bounds, min is {min}"),
                ));
            }
        }
        ParamKind::Integer { min, max, scale } => {
            if min > max {
                return Err(invalid(id, format!("min {min} is above max {max}")));
            }
            if scale.is_log() && *min <= 0 {
                return Err(invalid(
                    id,
                    format!("{scale:?} scale needs positive bounds, min is {min}"),
                ));
            }
        }
        ParamKind::Discrete { values, scale } => {
            if values.is_empty() {
                return Err(invalid(id, "discrete parameter has no values"));
            }
            if let Some(x) = values.iter().find(|x| !x.is_finite()) {
                return Err(invalid(id, format!("discrete value {x} is not finite")));
            }
            for (i, x) in values.iter().enumerate() {
                if values[..i].contains(x) {
                    return Err(invalid(id, format!("discrete value {x} is repeated")));
                }
            }
            if scale.is_log() {
                if let Some(x) = values.iter().find(|x| **x <= 0.0) {
                    return Err(invalid(
                        id,
                        format!("{scale:?} scale needs positive values, found {x}"),
                    ));
                }
            }
        }
        ParamKind::Categorical { values } => {
            if values.is_empty() {
                return Err(invalid(id, "categorical parameter has no values"));
            }
            for (i, s) in values.iter().enumerate() {
                if values[..i].contains(s) {
                    return Err(invalid(id, format!("categorical value {s:?} is repeated")));
                }
            }
        }
    }
    if let Some(d) = &p.default {
        if !p.contains(d) {
            return Err(invalid(
                id,
                format!("default value {d} is outside the parameter's domain"),
            ));
        }
    }
    for c in &p.children {
        let child = c.spec.id.as_str();
        let bad = |what: String| invalid(child, format!("conditional on parameter {id:?}: {what}"));
        match (&p.kind, &c.parent_values) {
            (ParamKind::Double { .. }, _) => {
                return Err(bad(
                    "a DOUBLE parameter cannot have conditional children".to_string()
                ))
            }
            (ParamKind::Discrete { values, .. }, ParentValues::Discrete(pv)) => {
                if pv.is_empty() {
                    return Err(bad("parent values are empty".to_string()));
                }
                if let Some(x) = pv.iter().find(|x| !values.contains(x)) {
                    return Err(bad(format!(
                        "parent value {x} is not one of the parent's values"
                    )));
                }
            }
            (ParamKind::Integer { min, max, .. }, ParentValues::Int(pv)) => {
                if pv.is_empty() {
                    return Err(bad("parent values are empty".to_string()));
                }
                if let Some(x) = pv.iter().find(|x| **x < *min || **x > *max) {
                    return Err(bad(format!(
                        "parent value {x} is outside the parent's range [{min}, {max}]"
                    )));
                }
            }
            (ParamKind::Categorical { values }, ParentValues::Categorical(pv)) => {
                if pv.is_empty() {
                    return Err(bad("parent values are empty".to_string()));
                }
                if let Some(x) = pv.iter().find(|x| !values.contains(x)) {
                    return Err(bad(format!(
                        "parent value {x:?} is not one of the parent's values"
                    )));
                }
            }
            (kind, pv) => {
                let k = match kind {
                    ParamKind::Discrete { .. } => "DISCRETE",
                    ParamKind::Integer { .. } => "INTEGER",
                    ParamKind::Categorical { .. } => "CATEGORICAL",
                    ParamKind::Double { .. } => "DOUBLE",
                };
                let v = match pv {
                    ParentValues::Discrete(_) => "discrete",
                    ParentValues::Int(_) => "integer",
                    ParentValues::Categorical(_) => "categorical",
                };
                return Err(bad(format!("{v} parent values given for a {k} parent")));
            }
        }
        validate_param(&c.spec, ids)?;
    }
    Ok(())
}

/// A parameter together with the condition that activates it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlatParam<'a> {
    pub spec: &'a ParamSpec,
    /// Index (in the flattened list) of the parent and the activating values.
    pub parent: Option<(usize, &'a ParentValues)>,
}

fn flatten_into<'a>(
    p: &'a ParamSpec,
    parent: Option<(usize, &'a ParentValues)>,
    out: &mut Vec<FlatParam<'a>>,
) {
    let me = out.len();
    out.push(FlatParam { spec: p, parent });
    for c in &p.children {
        flatten_into(&c.spec, Some((me, &c.parent_values)), out);
    }
}

/// Which flattened parameters are active in `a`: a top-level parameter
/// always; a child when its parent is active, present, and takes one of the
/// child's parent values.
pub(crate) fn active_flags(flat: &[FlatParam<'_>], a: &Assignment) -> Vec<bool> {
    let mut act = vec![false; flat.len()];
    for (i, fp) in flat.iter().enumerate() {
        act[i] = match fp.parent {
            None => true,
            Some((pi, pv)) => act[pi] && a.get(&flat[pi].spec.id).is_some_and(|v| pv.matches(v)),
        };
    }
    act
}

/// A canonical string for an assignment restricted to its active
/// parameters, used to detect repeats (integers and integral doubles compare
/// equal, as do -0.0 and 0.0).
pub(crate) fn canonical_key(flat: &[FlatParam<'_>], a: &Assignment) -> String {
    let act = active_flags(flat, a);
    let mut key = String::new();
    for (i, fp) in flat.iter().enumerate() {
        if !act[i] {
            continue;
        }
        key.push_str(&fp.spec.id);
        key.push('=');
        match a.get(&fp.spec.id) {
            None => key.push('\u{0}'),
            Some(Value::Str(s)) => {
                key.push('s');
                key.push_str(s);
            }
            Some(v) => {
                let x = v.as_f64().unwrap_or(f64::NAN);
                let x = if x == 0.0 { 0.0 } else { x };
                key.push_str(&format!("n{:016x}", x.to_bits()));
            }
        }
        key.push('\u{1}');
    }
    key
}
