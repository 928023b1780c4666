//! Grid search over discrete, categorical and integer parameters.
//!
//! The grid is enumerated in a fixed order, like nested loops over the
//! top-level parameters in the order given, the last one varying fastest;
//! integer values ascend, discrete and categorical values keep the order
//! given. A parameter's conditional children form a sub-grid nested under
//! each parent value that activates them. Points are produced by index, so a
//! grid with billions of points costs nothing until it is walked.

use std::collections::HashSet;

use crate::space::{canonical_key, Assignment, FlatParam, ParamKind, ParamSpec, Value};
use crate::TunerError;

/// Rejects DOUBLE parameters anywhere in the tree, as the managed service
/// does.
pub(crate) fn check(params: &[ParamSpec]) -> Result<(), TunerError> {
    for p in params {
        if matches!(p.kind, ParamKind::Double { .. }) {
            return Err(TunerError::Unsupported(format!(
                "GRID_SEARCH does not support DOUBLE parameter {}",
                p.id
            )));
        }
        let children: Vec<ParamSpec> = p.children.iter().map(|c| c.spec.clone()).collect();
        check(&children)?;
    }
    Ok(())
}

fn children_at<'a>(p: &'a ParamSpec, v: &Value) -> Vec<&'a ParamSpec> {
    p.children
        .iter()
        .filter(|c| c.parent_values.matches(v))
        .map(|c| &c.spec)
        .collect()
}

fn count_list(ps: &[&ParamSpec]) -> u128 {
    ps.iter()
        .fold(1u128, |acc, p| acc.saturating_mul(count_param(p)))
}

/// Values of a non-integer parameter, in grid order.
fn listed_values(p: &ParamSpec) -> Vec<Value> {
    match &p.kind {
        ParamKind::Discrete { values, .. } => values.iter().map(|v| Value::Double(*v)).collect(),
        ParamKind::Categorical { values } => values.iter().map(|v| Value::Str(v.clone())).collect(),
        _ => Vec::new(),
    }
}

/// Integer values that activate at least one child, ascending.
fn special_ints(p: &ParamSpec, min: i64, max: i64) -> Vec<i64> {
    let mut s: Vec<i64> = p
        .children
        .iter()
        .filter_map(|c| match &c.parent_values {
            crate::space::ParentValues::Int(v) => Some(v.clone()),
            _ => None,
        })
        .flatten()
        .filter(|v| *v >= min && *v <= max)
        .collect();
    s.sort_unstable();
    s.dedup();
    s
}

fn count_param(p: &ParamSpec) -> u128 {
    match &p.kind {
        ParamKind::Integer { min, max, .. } => {
            let specials = special_ints(p, *min, *max);
            let range = (*max as i128 - *min as i128 + 1) as u128;
            let mut total = range - specials.len() as u128;
            for s in specials {
                total = total.saturating_add(count_list(&children_at(p, &Value::Int(s))));
            }
            total
        }
        ParamKind::Double { .. } => 0,
        _ => listed_values(p).iter().fold(0u128, |acc, v| {
            acc.saturating_add(count_list(&children_at(p, v)))
        }),
    }
}

fn decode_list(ps: &[&ParamSpec], mut i: u128, out: &mut Assignment) {
    let counts: Vec<u128> = ps.iter().map(|p| count_param(p)).collect();
    let mut idx = vec![0u128; ps.len()];
    for j in (0..ps.len()).rev() {
        idx[j] = i % counts[j];
        i /= counts[j];
    }
    for (j, p) in ps.iter().enumerate() {
        decode_param(p, idx[j], out);
    }
}

fn decode_param(p: &ParamSpec, mut i: u128, out: &mut Assignment) {
    match &p.kind {
        ParamKind::Integer { min, max, .. } => {
            let mut cur = *min as i128;
            for s in special_ints(p, *min, *max) {
                let plain = (s as i128 - cur) as u128;
                if i < plain {
                    out.insert(p.id.clone(), Value::Int((cur + i as i128) as i64));
                    return;
                }
                i -= plain;
                let v = Value::Int(s);
                let kids = children_at(p, &v);
                let c = count_list(&kids);
                if i < c {
                    out.insert(p.id.clone(), v);
                    decode_list(&kids, i, out);
                    return;
                }
                i -= c;
                cur = s as i128 + 1;
            }
            out.insert(p.id.clone(), Value::Int((cur + i as i128) as i64));
        }
        _ => {
            for v in listed_values(p) {
                let kids = children_at(p, &v);
                let c = count_list(&kids);
                if i < c {
                    out.insert(p.id.clone(), v);
                    decode_list(&kids, i, out);
                    return;
                }
                i -= c;
            }
        }
    }
}

/// Number of grid points (saturating).
pub(crate) fn size(params: &[ParamSpec]) -> u128 {
    count_list(&params.iter().collect::<Vec<_>>())
}

/// The grid point with the given index (`index < size`).
pub(crate) fn point(params: &[ParamSpec], index: u128) -> Assignment {
    let mut a = Assignment::new();
    decode_list(&params.iter().collect::<Vec<_>>(), index, &mut a);
    a
}

pub(crate) fn suggest(
    params: &[ParamSpec],
    flat: &[FlatParam<'_>],
    used: &HashSet<String>,
    count: usize,
) -> Result<Vec<Assignment>, TunerError> {
    check(params)?;
    let total = size(params);
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut i = 0u128;
    while out.len() < count && i < total {
        let a = point(params, i);
        let key = canonical_key(flat, &a);
        if !used.contains(&key) && seen.insert(key) {
            out.push(a);
        }
        i += 1;
    }
    if out.is_empty() && count > 0 {
        return Err(TunerError::Exhausted);
    }
    Ok(out)
}
