//! The tensor engine's dI/dt throttle (trn2_facts.md section 5.7, [S18]): when work begins the
//! PE array runs at `THROTTLE_START_FRACTION` (50%) of its rate and ramps linearly to full over
//! `THROTTLE_RAMP_S` (~3 us); if utilisation drops below `THROTTLE_REENGAGE_UTILIZATION` over a
//! `THROTTLE_REENGAGE_WINDOW_S` window the limit re-engages. We model the window rule as: an idle
//! gap longer than `window * (1 - utilisation)` (1.5 us) restarts the ramp. The linear shape of
//! the ramp is our assumption; the docs give only its start and length.

use crate::spec::{
    THROTTLE_RAMP_S, THROTTLE_REENGAGE_UTILIZATION, THROTTLE_REENGAGE_WINDOW_S,
    THROTTLE_START_FRACTION,
};

/// The throttle state along one engine's timeline.
#[derive(Debug, Clone, Copy)]
pub struct Throttle {
    enabled: bool,
    /// Wall time at which the current ramp started (None before any work).
    ramp_start: Option<f64>,
    /// Wall time the engine last finished work.
    last_end: f64,
    /// Wall time lost to the throttle so far.
    pub lost_s: f64,
}

impl Throttle {
    /// A throttle that is on (the hardware default) or off (`enabled = false`: full rate always).
    pub fn new(enabled: bool) -> Self {
        Throttle {
            enabled,
            ramp_start: None,
            last_end: 0.0,
            lost_s: 0.0,
        }
    }

    /// Runs `work_s` seconds of full-rate work starting at wall time `start`; returns the end.
    pub fn run(&mut self, start: f64, work_s: f64) -> f64 {
        if !self.enabled || work_s <= 0.0 {
            self.last_end = start + work_s.max(0.0);
            return self.last_end;
        }
        let idle_limit = THROTTLE_REENGAGE_WINDOW_S * (1.0 - THROTTLE_REENGAGE_UTILIZATION);
        let ramp_start = match self.ramp_start {
            Some(r) if start - self.last_end <= idle_limit => r,
            _ => start,
        };
        self.ramp_start = Some(ramp_start);
        let t0 = start - ramp_start;
        let t1 = ramp_end(t0, work_s);
        self.lost_s += (t1 - t0) - work_s;
        self.last_end = ramp_start + t1;
        self.last_end
    }
}

/// Solves `integral_{t0}^{t1} rate(t) dt = w` for `t1`, with
/// `rate(t) = s + (1 - s) * min(1, t / T)`.
fn ramp_end(t0: f64, w: f64) -> f64 {
    let (s, tr) = (THROTTLE_START_FRACTION, THROTTLE_RAMP_S);
    if t0 >= tr {
        return t0 + w;
    }
    let a = (1.0 - s) / (2.0 * tr);
    let work_to_full = s * (tr - t0) + a * (tr * tr - t0 * t0);
    if w >= work_to_full {
        return tr + (w - work_to_full);
    }
    // a t1^2 + s t1 - (a t0^2 + s t0 + w) = 0
    let c = a * t0 * t0 + s * t0 + w;
    (-s + (s * s + 4.0 * a * c).sqrt()) / (2.0 * a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_work_loses_the_ramp_deficit() {
        // A ramp from 50% to 100% over 3 us loses 0.75 us against full rate.
        let mut t = Throttle::new(true);
        let end = t.run(0.0, 100e-6);
        assert!((end - 100.75e-6).abs() < 1e-12, "{end}");
        assert!((t.lost_s - 0.75e-6).abs() < 1e-12);
    }

    #[test]
    fn first_work_runs_at_half_rate_and_idle_gaps_restart_the_ramp() {
        let mut t = Throttle::new(true);
        // 1 ns of work at the start takes just under 2 ns (the rate has risen a little).
        let end = t.run(0.0, 1e-9);
        let exact = (-0.5 + (0.25f64 + 4.0 * (0.5 / 6e-6) * 1e-9).sqrt()) / (2.0 * 0.5 / 6e-6);
        assert!(
            (end - exact).abs() < 1e-18 && end < 2e-9 && end > 1.999e-9,
            "{end}"
        );
        let mut t = Throttle::new(true);
        let e1 = t.run(0.0, 10e-6);
        let e2 = t.run(e1 + 1.0e-6, 10e-6); // short gap: still at full rate
        assert!((e2 - (e1 + 11.0e-6)).abs() < 1e-12);
        let e3 = t.run(e2 + 2.0e-6, 10e-6); // long gap: ramp again
        assert!((e3 - (e2 + 12.75e-6)).abs() < 1e-12);
        let mut off = Throttle::new(false);
        assert_eq!(off.run(0.0, 1e-6), 1e-6);
    }
}
