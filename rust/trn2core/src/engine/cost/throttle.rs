//! The tensor engine's dI/dt throttle (\[S18\]): when work begins the
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
        Throttle { enabled, ramp_start: None, last_end: 0.0, lost_s: 0.0 }
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
/// `rate(t) = s + (1 - s) * min(1, t / T)` (times in seconds).
fn ramp_end(t0: f64, w: f64) -> f64 {
    ramp_end_over(t0, w, THROTTLE_RAMP_S)
}

/// [`ramp_end`] in any time unit: `tr` is the ramp's length in that unit.
fn ramp_end_over(t0: f64, w: f64, tr: f64) -> f64 {
    let s = THROTTLE_START_FRACTION;
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

/// The throttle on an integer timeline of `ticks_per_s` ticks a second (the GEMM schedule's
/// clock, `engine::cost::fast_forward`): the same model as [`Throttle`], with every end time rounded to
/// the nearest tick. While the ramp lasts, the exact (unrounded) end of the previous run is
/// carried to the next one when it starts right away, so rounding errors do not accumulate
/// along the ramp; once the ramp is over, work runs at full rate in exact integer arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TickThrottle {
    enabled: bool,
    /// The ramp's length and the idle gap that restarts it, in ticks.
    ramp_ticks: f64,
    idle_limit_ticks: f64,
    ramp_start: Option<u64>,
    last_end: u64,
    /// The exact end of the last run, in ticks after `ramp_start` (used during the ramp).
    exact_end: f64,
    /// Ticks lost to the throttle so far.
    pub lost: u64,
}

/// What a [`TickThrottle`]'s future behaviour depends on, relative to a time `t`: two throttles
/// with equal keys at `t1` and `t2` do the same things shifted by `t2 - t1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThrottleKey {
    /// No work yet (the next run starts the ramp).
    Idle,
    /// Off, or the ramp is over: full rate until an idle gap restarts it.
    Full {
        /// Ticks from the end of the last run to `t` (an idle gap restarts the ramp).
        since_last_end: u64,
    },
    /// On the ramp: ticks since it started, the exact end's bits, ticks since the last run.
    Ramp {
        /// Ticks from the start of the ramp to `t`.
        since_ramp_start: u64,
        /// `f64::to_bits` of the last run's exact (unrounded) end, in ticks after the ramp's
        /// start (as bits so the key is `Eq` and `Hash`).
        exact_end_bits: u64,
        /// Ticks from the end of the last run to `t`.
        since_last_end: u64,
    },
}

impl TickThrottle {
    /// A throttle on (the hardware default) or off, on a clock of `ticks_per_s`.
    pub fn new(enabled: bool, ticks_per_s: f64) -> Self {
        TickThrottle {
            enabled,
            ramp_ticks: THROTTLE_RAMP_S * ticks_per_s,
            idle_limit_ticks: THROTTLE_REENGAGE_WINDOW_S
                * (1.0 - THROTTLE_REENGAGE_UTILIZATION)
                * ticks_per_s,
            ramp_start: None,
            last_end: 0,
            exact_end: 0.0,
            lost: 0,
        }
    }

    /// Runs `work` ticks of full-rate work starting at tick `start` (not before the last run's
    /// end); returns the tick it ends.
    pub fn run(&mut self, start: u64, work: u64) -> u64 {
        if !self.enabled || work == 0 {
            self.last_end = start + work;
            return self.last_end;
        }
        let restart = match self.ramp_start {
            Some(_) => start.saturating_sub(self.last_end) as f64 > self.idle_limit_ticks,
            None => true,
        };
        let ramp_start = if restart {
            self.exact_end = 0.0;
            start
        } else {
            self.ramp_start.unwrap_or(start)
        };
        self.ramp_start = Some(ramp_start);
        let since = start - ramp_start;
        let end = if since as f64 >= self.ramp_ticks {
            start + work
        } else {
            let t0 = if !restart && start == self.last_end { self.exact_end } else { since as f64 };
            let t1 = ramp_end_over(t0, work as f64, self.ramp_ticks);
            let rounded = ramp_start + t1.round() as u64;
            if rounded >= start + work {
                self.exact_end = t1;
                rounded
            } else {
                self.exact_end = (start + work - ramp_start) as f64;
                start + work
            }
        };
        self.lost += end - start - work;
        self.last_end = end;
        end
    }

    /// Whether work that starts right at the last run's end runs at full rate (off, or the
    /// ramp is over).
    pub fn at_full_rate(&self) -> bool {
        !self.enabled
            || self.ramp_start.is_some_and(|r| (self.last_end - r) as f64 >= self.ramp_ticks)
    }

    /// The tick the last run ended.
    pub fn last_end(&self) -> u64 {
        self.last_end
    }

    /// Runs `work` ticks starting right at the last run's end at full rate: what [`run`]
    /// does then, in one step. Only valid when [`at_full_rate`] holds.
    ///
    /// [`run`]: TickThrottle::run
    /// [`at_full_rate`]: TickThrottle::at_full_rate
    pub fn run_full(&mut self, work: u64) -> u64 {
        debug_assert!(self.at_full_rate());
        self.last_end += work;
        self.last_end
    }

    /// The state the throttle's future depends on, seen from tick `t` (at or after the last
    /// run's end).
    pub fn key(&self, t: u64) -> ThrottleKey {
        let since_last_end = t - self.last_end.min(t);
        match self.ramp_start {
            _ if self.at_full_rate() => ThrottleKey::Full { since_last_end },
            None => ThrottleKey::Idle,
            Some(r) => ThrottleKey::Ramp {
                since_ramp_start: t - r,
                exact_end_bits: self.exact_end.to_bits(),
                since_last_end,
            },
        }
    }

    /// Moves the throttle's timeline `d` ticks later (and adds `lost` ticks lost meanwhile).
    pub fn shift(&mut self, d: u64, lost: u64) {
        self.last_end += d;
        if let Some(r) = self.ramp_start.as_mut() {
            *r += d;
        }
        self.lost += lost;
    }
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
        assert!((end - exact).abs() < 1e-18 && end < 2e-9 && end > 1.999e-9, "{end}");
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
