//! Maps between assignments and unit-cube vectors.
//!
//! Two representations are used:
//! * *search coordinates* `z ∈ [0,1]^P`, one per flattened parameter, which
//!   every sampler and the acquisition search move in: a numeric parameter
//!   goes through its scale (integers over `[min-0.5, max+0.5]` so that every
//!   integer gets an equal share under a linear scale, then rounded); a
//!   discrete or categorical parameter picks value `floor(z*k)`;
//! * GP *features* `x ∈ [0,1]^D`: numeric parameters through their scale
//!   (discrete values at their scaled position between the smallest and the
//!   largest value), categoricals one-hot; an inactive conditional parameter
//!   is set to the fixed value 0.5 (numeric) or all zeros (one-hot).

use crate::space::{active_flags, Assignment, FlatParam, ParamKind, Value};
use crate::TunerError;

pub(crate) struct Encoder<'a> {
    pub flat: Vec<FlatParam<'a>>,
    /// Offset of each flattened parameter's first feature.
    offsets: Vec<usize>,
    pub n_features: usize,
    /// Discrete values sorted ascending, per flattened parameter.
    sorted: Vec<Vec<f64>>,
}

fn sorted_values(kind: &ParamKind) -> Vec<f64> {
    match kind {
        ParamKind::Discrete { values, .. } => {
            let mut v = values.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            v
        }
        _ => Vec::new(),
    }
}

impl<'a> Encoder<'a> {
    pub(crate) fn new(flat: Vec<FlatParam<'a>>) -> Self {
        let mut offsets = Vec::with_capacity(flat.len());
        let mut n = 0;
        let mut sorted = Vec::with_capacity(flat.len());
        for fp in &flat {
            offsets.push(n);
            n += match &fp.spec.kind {
                ParamKind::Categorical { values } => values.len(),
                _ => 1,
            };
            sorted.push(sorted_values(&fp.spec.kind));
        }
        Encoder {
            flat,
            offsets,
            n_features: n,
            sorted,
        }
    }

    pub(crate) fn n_params(&self) -> usize {
        self.flat.len()
    }

    /// The GP feature of parameter `j` (its first, for a categorical one).
    pub(crate) fn feature_of(&self, j: usize) -> usize {
        self.offsets[j]
    }

    /// The value of parameter `j` at search coordinate `z`.
    pub(crate) fn value_at(&self, j: usize, z: f64) -> Value {
        let z = z.clamp(0.0, 1.0);
        match &self.flat[j].spec.kind {
            ParamKind::Double { min, max, scale } => Value::Double(scale.at_unit(z, *min, *max)),
            ParamKind::Integer { min, max, scale } => {
                let x = scale.at_unit(z, *min as f64 - 0.5, *max as f64 + 0.5);
                Value::Int((x.round() as i64).clamp(*min, *max))
            }
            ParamKind::Discrete { .. } => {
                let v = &self.sorted[j];
                let i = ((z * v.len() as f64) as usize).min(v.len() - 1);
                Value::Double(v[i])
            }
            ParamKind::Categorical { values } => {
                let i = ((z * values.len() as f64) as usize).min(values.len() - 1);
                Value::Str(values[i].clone())
            }
        }
    }

    /// The search coordinate of value `v` of parameter `j` (centre of its
    /// cell for discrete and categorical values), `None` if it is not a
    /// value of the parameter.
    pub(crate) fn coord_of(&self, j: usize, v: &Value) -> Option<f64> {
        match &self.flat[j].spec.kind {
            ParamKind::Double { min, max, scale } => Some(scale.to_unit(v.as_f64()?, *min, *max)),
            ParamKind::Integer { min, max, scale } => {
                let x = v.as_f64()?.round().clamp(*min as f64, *max as f64);
                Some(scale.to_unit(x, *min as f64 - 0.5, *max as f64 + 0.5))
            }
            ParamKind::Discrete { .. } => {
                let vals = &self.sorted[j];
                let x = v.as_f64()?;
                let i = nearest(vals, x);
                Some((i as f64 + 0.5) / vals.len() as f64)
            }
            ParamKind::Categorical { values } => {
                let s = v.as_str()?;
                let i = values.iter().position(|c| c == s)?;
                Some((i as f64 + 0.5) / values.len() as f64)
            }
        }
    }

    /// Decodes search coordinates into an assignment of the active
    /// parameters; `fixed` values (e.g. defaults) override coordinates.
    pub(crate) fn decode(&self, z: &[f64], fixed: &dyn Fn(usize) -> Option<Value>) -> Assignment {
        let mut a = Assignment::new();
        let mut act = vec![false; self.flat.len()];
        for (j, fp) in self.flat.iter().enumerate() {
            act[j] = match fp.parent {
                None => true,
                Some((pi, pv)) => {
                    act[pi] && a.get(&self.flat[pi].spec.id).is_some_and(|v| pv.matches(v))
                }
            };
            if act[j] {
                let v = fixed(j).unwrap_or_else(|| self.value_at(j, z[j]));
                a.insert(fp.spec.id.clone(), v);
            }
        }
        a
    }

    /// Search coordinates of an assignment; inactive or missing parameters
    /// get `fill`.
    pub(crate) fn coords(&self, a: &Assignment, fill: f64) -> Vec<f64> {
        self.flat
            .iter()
            .enumerate()
            .map(|(j, fp)| {
                a.get(&fp.spec.id)
                    .and_then(|v| self.coord_of(j, v))
                    .unwrap_or(fill)
            })
            .collect()
    }

    /// GP features of an assignment. Every active parameter must be present
    /// with a value of the right type; numbers outside the range are clamped.
    pub(crate) fn features(&self, a: &Assignment) -> Result<Vec<f64>, TunerError> {
        let act = active_flags(&self.flat, a);
        let mut x = vec![0.0; self.n_features];
        for (j, fp) in self.flat.iter().enumerate() {
            let o = self.offsets[j];
            let id = &fp.spec.id;
            if !act[j] {
                if !matches!(fp.spec.kind, ParamKind::Categorical { .. }) {
                    x[o] = 0.5;
                }
                continue;
            }
            let bad = |m: &str| TunerError::InvalidTrial {
                param: id.clone(),
                message: m.to_string(),
            };
            let v = a
                .get(id)
                .ok_or_else(|| bad("active parameter is missing"))?;
            match &fp.spec.kind {
                ParamKind::Double { min, max, scale } => {
                    let f = v
                        .as_f64()
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| bad("expected a number"))?;
                    x[o] = scale.to_unit(f, *min, *max);
                }
                ParamKind::Integer { min, max, scale } => {
                    let f = v
                        .as_f64()
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| bad("expected an integer"))?;
                    let f = f.round().clamp(*min as f64, *max as f64);
                    x[o] = scale.to_unit(f, *min as f64 - 0.5, *max as f64 + 0.5);
                }
                ParamKind::Discrete { scale, .. } => {
                    let f = v
                        .as_f64()
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| bad("expected a number"))?;
                    let vals = &self.sorted[j];
                    let lo = vals[0];
                    let hi = vals[vals.len() - 1];
                    let snapped = vals[nearest(vals, f)];
                    x[o] = if hi > lo {
                        scale.to_unit(snapped, lo, hi)
                    } else {
                        0.5
                    };
                }
                ParamKind::Categorical { values } => {
                    let s = v
                        .as_str()
                        .ok_or_else(|| bad("expected a categorical value"))?;
                    let i = values.iter().position(|c| c == s).ok_or_else(|| {
                        bad(&format!("{s:?} is not one of the parameter's values"))
                    })?;
                    x[o + i] = 1.0;
                }
            }
        }
        Ok(x)
    }
}

fn nearest(sorted: &[f64], x: f64) -> usize {
    let mut best = 0;
    for (i, v) in sorted.iter().enumerate() {
        if (v - x).abs() < (sorted[best] - x).abs() {
            best = i;
        }
    }
    best
}
