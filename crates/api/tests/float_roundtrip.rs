//! Doubles survive JSON exactly: what is written is read back bit for bit (serde_json's
//! `float_roundtrip` parser), so stored trial parameters and metrics do not drift.

use proptest::prelude::*;
use trainyard_api::hptuning::{DoubleValueSpec, MeasurementMetric};

fn round_trip(x: f64) -> f64 {
    let text = serde_json::to_string(&x).expect("a finite double serializes");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn assert_exact(x: f64) {
    let back = round_trip(x);
    assert_eq!(back.to_bits(), x.to_bits(), "{x:e} came back as {back:e}");
    // Through a JSON value as well (the stored resources are read this way).
    let text = serde_json::to_string(&x).expect("serializes");
    let v: serde_json::Value = serde_json::from_str(&text).expect("parses");
    let back = v.as_f64().expect("a number");
    assert_eq!(
        back.to_bits(),
        x.to_bits(),
        "{x:e} came back as {back:e} through a Value"
    );
}

#[test]
// Some literals have more digits than a double holds, on purpose: the compiler rounds them
// to the nearest double, the value under test.
#[allow(clippy::excessive_precision)]
fn known_doubles_round_trip_exactly() {
    for x in [
        0.1 + 0.2,
        0.30000000000000004,
        0.1,
        1e-300,
        5e-324,
        2.2250738585072014e-308,
        2.225073858507201e-308,
        f64::MIN_POSITIVE,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        1.0 / 3.0,
        -0.0,
        0.0,
        9007199254740993.0,
        123456789.12345678,
        0.000123456789012345678,
        1.7976931348623157e308,
        // Read back one ULP off by the default parser.
        9.441791986927227e-169,
    ] {
        assert_exact(x);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Any finite bit pattern.
    #[test]
    fn any_finite_double_round_trips_exactly(bits in any::<u64>()) {
        let x = f64::from_bits(bits);
        prop_assume!(x.is_finite());
        let back = round_trip(x);
        prop_assert_eq!(back.to_bits(), bits, "{:e} came back as {:e}", x, back);
    }

    /// The wire types that carry doubles (search bounds, reported metrics).
    #[test]
    fn wire_doubles_round_trip_exactly(a in any::<u64>(), b in any::<u64>(), c in any::<u64>()) {
        let (a, b, c) = (f64::from_bits(a), f64::from_bits(b), f64::from_bits(c));
        prop_assume!(a.is_finite() && b.is_finite() && c.is_finite());
        let spec = DoubleValueSpec { min_value: a, max_value: b, default_value: Some(c) };
        let text = serde_json::to_string(&spec).expect("serializes");
        let back: DoubleValueSpec = serde_json::from_str(&text).expect("parses");
        prop_assert_eq!(back.min_value.to_bits(), a.to_bits(), "{}", text);
        prop_assert_eq!(back.max_value.to_bits(), b.to_bits(), "{}", text);
        prop_assert_eq!(back.default_value.map(f64::to_bits), Some(c.to_bits()), "{}", text);
        let metric = MeasurementMetric { metric_id: "loss".into(), value: a };
        let text = serde_json::to_string(&metric).expect("serializes");
        let back: MeasurementMetric = serde_json::from_str(&text).expect("parses");
        prop_assert_eq!(back.value.to_bits(), a.to_bits(), "{}", text);
    }
}
