//! How far one extra listener per CPU moves a median, against the band:
//! whether the budget could see a change of that size.

use super::*;

/// How far one extra listener per CPU moves a median, against the band.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    /// The fixture measured.
    pub fixture: String,
    /// `load` or `unload`.
    pub op: String,
    /// median(L1) / median(L0) - 1.
    pub first_listener: f64,
    /// (median(Lmax) - median(L0)) / max / median(Lmax): one more listener
    /// on top of the most measured, assuming the cost is linear.
    pub one_more_at_max: Option<(u32, f64)>,
    /// The relative band a median has.
    pub tolerance: f64,
}

impl Sensitivity {
    /// Whether the check flags a change the size of one listener per CPU,
    /// both from none and on top of the most measured.
    pub fn seen(&self) -> bool {
        self.first_listener > self.tolerance
            && self.one_more_at_max.is_none_or(|(_, e)| e > self.tolerance)
    }
}

/// The sensitivity of every fixture × operation measured with and
/// without listeners.
pub fn sensitivity(points: &[Point], tolerance: f64) -> Vec<Sensitivity> {
    let mut out = Vec::new();
    for b in points.iter().filter(|p| p.listeners_per_cpu == 0) {
        let same: Vec<&Point> = points
            .iter()
            .filter(|p| p.fixture == b.fixture && p.program == b.program)
            .collect();
        let Some(one) = same.iter().find(|p| p.listeners_per_cpu == 1) else {
            continue;
        };
        let most = same
            .iter()
            .max_by_key(|p| p.listeners_per_cpu)
            .filter(|p| p.listeners_per_cpu > 1);
        for op in Op::ALL {
            let base = op.of(b).median;
            out.push(Sensitivity {
                fixture: b.fixture.clone(),
                op: op.name().to_string(),
                first_listener: op.of(one).median / base - 1.0,
                one_more_at_max: most.map(|m| {
                    let n = m.listeners_per_cpu;
                    let at = op.of(m).median;
                    (n, (at - base) / f64::from(n) / at)
                }),
                tolerance,
            });
        }
    }
    out
}
