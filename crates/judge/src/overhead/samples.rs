//! Timings and points for tests, here and in the crates above (feature
//! `test-support`): the shapes a guest's `measure` steps report.

use super::*;

/// One `measure` step's timings.
pub fn timings(fixture: &str, functions: u32, l: u32, load: &[u64], unload: &[u64]) -> Timings {
    Timings {
        fixture: fixture.into(),
        program: format!("kloop_{fixture}"),
        functions,
        listeners_per_cpu: l,
        load_ns: load.to_vec(),
        unload_ns: unload.to_vec(),
    }
}

/// Points of a small sample run.
pub fn sample_points() -> Vec<Point> {
    [
        timings("basic", 1, 0, &[100, 100, 102], &[10, 10, 10]),
        timings("basic", 1, 1, &[103, 103, 104], &[20, 20, 21]),
        timings("basic", 1, 8, &[124, 124, 130], &[90, 90, 90]),
    ]
    .iter()
    .filter_map(Point::of)
    .collect()
}
