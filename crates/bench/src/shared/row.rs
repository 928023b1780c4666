//! A line of the one table `scripts/bench` writes: what a bench measured, its baseline
//! from the same run, and their ratio. Printed beside the bench's own report;
//! `scripts/bench` collects the lines that start with `bench-row:`.

/// `ratio` is ours over the baseline, in the sense the measure says.
pub fn row(bench: &str, measure: &str, ours: &str, baseline: &str, ratio: f64) {
    println!("bench-row: {bench} | {measure} | {ours} | {baseline} | {ratio:.3}x");
}
