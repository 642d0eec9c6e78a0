//! The [`Report`] every costed operation returns, and its Chrome/Perfetto trace.

use crate::spec::{
    COLLECTIVE_PUBLISHED_CASES, COLLECTIVE_PUBLISHED_RATIO_HIGH, COLLECTIVE_PUBLISHED_RATIO_LOW,
    DMA_PUBLISHED_CASES, DMA_PUBLISHED_RATIO_HIGH, DMA_PUBLISHED_RATIO_LOW, GEMM_PUBLISHED_CASES,
    GEMM_PUBLISHED_RATIO_HIGH, GEMM_PUBLISHED_RATIO_LOW,
};

/// One span on one track of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Track (engine, DMA queue or link), one row in the trace viewer.
    pub track: &'static str,
    /// What the span is (an instruction, a transfer, a phase).
    pub name: &'static str,
    /// Start, seconds from the start of the operation.
    pub start_s: f64,
    /// Length, seconds.
    pub dur_s: f64,
    /// What a person clicks the span for (the trace's `args`): bytes, PSUM bank, tile indices,
    /// instruction index, ... A key `hbm_bytes` also feeds the trace's HBM bandwidth counter.
    pub args: Vec<(&'static str, f64)>,
}

impl Event {
    /// An event on `track` from `start_s` lasting `dur_s` seconds.
    pub fn new(track: &'static str, name: &'static str, start_s: f64, dur_s: f64) -> Self {
        Event { track, name, start_s, dur_s, args: Vec::new() }
    }

    /// The event with one more argument.
    pub fn with(mut self, key: &'static str, value: f64) -> Self {
        self.args.push((key, value));
        self
    }
}

/// Writes `value` as a JSON number: integral values without a fraction, non-finite as `null`.
pub(crate) fn write_json_number(out: &mut String, value: f64) {
    use std::fmt::Write as _;
    if !value.is_finite() {
        out.push_str("null");
    } else if value.fract() == 0.0 && value.abs() < 9.0e15 {
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Writes `"args":{...}` of numeric arguments.
pub(crate) fn write_json_args(out: &mut String, args: &[(&str, f64)]) {
    out.push_str("\"args\":{");
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(k);
        out.push_str("\":");
        write_json_number(out, *v);
    }
    out.push('}');
}

/// Appends Chrome counter events (`"ph":"C"`) named `name` on process `pid`: the bandwidth, in
/// GB/s (10^9 bytes/s), of the spans `(start_s, dur_s, bytes)` running at each moment, each
/// moving its bytes at a constant rate. One event wherever the sum changes; the last is 0.
pub(crate) fn write_bandwidth_counter(
    out: &mut String, pid: usize, name: &str, spans: &[(f64, f64, f64)],
) {
    // Appending to a string: the drain never fails.
    let _ = write_bandwidth_counter_drained(out, pid, name, spans, &mut |_| Ok(()));
}

/// [`write_bandwidth_counter`] calling `drain(out)` after every event, so that a streaming
/// writer can hand the text on (and check for cancellation) instead of holding it whole.
pub(crate) fn write_bandwidth_counter_drained(
    out: &mut String, pid: usize, name: &str, spans: &[(f64, f64, f64)],
    drain: &mut dyn FnMut(&mut String) -> crate::Result<()>,
) -> crate::Result<()> {
    use std::fmt::Write as _;
    // (time, change of rate, change of the count of running spans)
    let mut edges: Vec<(f64, f64, i64)> = Vec::with_capacity(2 * spans.len());
    for &(start, dur, bytes) in spans {
        if dur > 0.0 && bytes > 0.0 && start.is_finite() && dur.is_finite() {
            let rate = bytes / dur / 1e9;
            edges.push((start, rate, 1));
            edges.push((start + dur, -rate, -1));
        }
    }
    if edges.is_empty() {
        return Ok(());
    }
    edges.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut rate, mut running) = (0.0f64, 0i64);
    let mut i = 0;
    while i < edges.len() {
        let t = edges[i].0;
        while i < edges.len() && edges[i].0 == t {
            rate += edges[i].1;
            running += edges[i].2;
            i += 1;
        }
        // Sums of floats drift: nothing running is exactly zero.
        if running == 0 {
            rate = 0.0;
        }
        let _ = write!(
            out,
            ",{{\"ph\":\"C\",\"name\":\"{name}\",\"pid\":{pid},\"ts\":{:.6},\"args\":{{\"GB/s\":",
            t * 1e6
        );
        write_json_number(out, rate.max(0.0));
        out.push_str("}}");
        drain(out)?;
    }
    Ok(())
}

/// How far published Trainium2 measurements of this kind of operation were from the model's
/// predictions of them: every published case's time lay between `low x` and `high x` the
/// predicted time (the calibration residuals; benches/fidelity_table.py, docs/fidelity.md). An
/// operation of a kind no published case is of has `cases == 0` and no range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uncertainty {
    /// Smallest published / predicted ratio (`None` without published cases of this kind).
    pub low: Option<f64>,
    /// Largest published / predicted ratio (`None` without published cases of this kind).
    pub high: Option<f64>,
    /// Published cases the range is taken over (0: none of this kind).
    pub cases: usize,
    /// Which published cases: `"collective"`, `"dma"` or `"gemm"`.
    pub basis: &'static str,
}

/// The kind of GEMM the published GEMM cases are (benches/fidelity/published.toml, `kind =
/// "gemm"`, `use = "check"`): dense fp32 operands, `perf_mode="none"`, compute-bound, on one
/// physical NeuronCore. A GEMM of another format, sparse, double_row, memory-bound or split
/// over several cores has no published case (docs/fidelity.md, "Guesses").
pub const GEMM_PUBLISHED_KIND: &str = "dense fp32, compute-bound, on one NeuronCore";

impl Uncertainty {
    /// The range `low..high` of `cases` published cases of kind `basis`.
    const fn published(low: f64, high: f64, cases: usize, basis: &'static str) -> Uncertainty {
        Uncertainty { low: Some(low), high: Some(high), cases, basis }
    }

    /// The range of the published collective cases (nccom-test rows).
    pub const COLLECTIVE: Uncertainty = Uncertainty::published(
        COLLECTIVE_PUBLISHED_RATIO_LOW,
        COLLECTIVE_PUBLISHED_RATIO_HIGH,
        COLLECTIVE_PUBLISHED_CASES,
        "collective",
    );
    /// The range of the published DMA transfers.
    pub const DMA: Uncertainty = Uncertainty::published(
        DMA_PUBLISHED_RATIO_LOW,
        DMA_PUBLISHED_RATIO_HIGH,
        DMA_PUBLISHED_CASES,
        "dma",
    );
    /// The range of the published GEMM kernels (all of [`GEMM_PUBLISHED_KIND`]).
    pub const GEMM: Uncertainty = Uncertainty::published(
        GEMM_PUBLISHED_RATIO_LOW,
        GEMM_PUBLISHED_RATIO_HIGH,
        GEMM_PUBLISHED_CASES,
        "gemm",
    );
    /// A GEMM of a kind no published case is of: no range.
    pub const GEMM_UNPUBLISHED: Uncertainty =
        Uncertainty { low: None, high: None, cases: 0, basis: "gemm" };
    /// The range of the published whole-model time-to-first-token cases.
    pub const WORKLOAD_PREFILL: Uncertainty = Uncertainty::published(
        crate::spec::WORKLOAD_PREFILL_PUBLISHED_RATIO_LOW,
        crate::spec::WORKLOAD_PREFILL_PUBLISHED_RATIO_HIGH,
        crate::spec::WORKLOAD_PREFILL_PUBLISHED_CASES,
        "workload_prefill",
    );
    /// The range of the published whole-model time-per-output-token cases.
    pub const WORKLOAD_DECODE: Uncertainty = Uncertainty::published(
        crate::spec::WORKLOAD_DECODE_PUBLISHED_RATIO_LOW,
        crate::spec::WORKLOAD_DECODE_PUBLISHED_RATIO_HIGH,
        crate::spec::WORKLOAD_DECODE_PUBLISHED_CASES,
        "workload_decode",
    );

    /// Whole-model training steps: no published Trainium2 training throughput is known, so
    /// no range ("no published case").
    pub const WORKLOAD_TRAINING: Uncertainty =
        Uncertainty { low: None, high: None, cases: 0, basis: "workload_training" };

    /// The range for a report of `operation` (`"gemm"`, `"dma"`, `"collective"`), if published
    /// cases of that kind of operation exist.
    pub fn for_operation(operation: &str) -> Option<Uncertainty> {
        match operation {
            "gemm" => Some(Uncertainty::GEMM),
            "dma" => Some(Uncertainty::DMA),
            "collective" => Some(Uncertainty::COLLECTIVE),
            _ => None,
        }
    }

    /// The range for a GEMM of format `format` (its trn2core name), sparse or dense,
    /// `double_row` or not, `bound` (`"compute"` or `"memory"`), on `physical_cores` cores: the
    /// published GEMM range if it is of [`GEMM_PUBLISHED_KIND`], else none.
    pub fn for_gemm(
        format: &str, sparse: bool, double_row: bool, bound: &str, physical_cores: usize,
    ) -> Uncertainty {
        let published_kind =
            format == "fp32" && !sparse && !double_row && bound == "compute" && physical_cores == 1;
        if published_kind {
            Uncertainty::GEMM
        } else {
            Uncertainty::GEMM_UNPUBLISHED
        }
    }

    /// `"published cases within -12%/+8% (17 cases)"`, or, without cases of this kind,
    /// `"no published case of this kind (...)"`.
    pub fn text(&self) -> String {
        let pct = |r: f64| {
            let p = (r - 1.0) * 100.0;
            if p.abs() < 0.5 {
                "0%".to_string()
            } else {
                format!("{p:+.0}%")
            }
        };
        match (self.low, self.high) {
            (Some(low), Some(high)) if self.cases > 0 => format!(
                "published cases within {}/{} ({} {} case{})",
                pct(low),
                pct(high),
                self.cases,
                self.basis,
                if self.cases == 1 { "" } else { "s" }
            ),
            _ if self.basis == "gemm" => format!(
                "no published case of this kind (the published GEMMs: {GEMM_PUBLISHED_KIND})"
            ),
            _ => "no published case of this kind".to_string(),
        }
    }
}

/// Timing of an operation on the emulated hardware (contract section 6).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// What was costed: "gemm", "matmul", "dma", ...
    pub operation: &'static str,
    /// One line naming the operation, its shape, formats and mode, e.g.
    /// `"GEMM M=128 K=128 N=512 bf16 perf_mode=none on one NeuronCore"`.
    pub description: String,
    /// Tensor-engine instructions issued.
    pub instructions: u64,
    /// Tensor-engine busy cycles, summed over instructions.
    pub pe_cycles: u64,
    /// Wall time in PE cycles (2.4 GHz).
    pub cycles: f64,
    /// Modelled wall time, seconds.
    pub seconds: f64,
    /// Floating-point operations done (`2 M K N` for a GEMM).
    pub flops: f64,
    /// Achieved throughput over the wall time.
    pub tflops: f64,
    /// Throughput over the PE-busy time only.
    pub pe_tflops: f64,
    /// The engines' peak for these operands, TFLOP/s (utilisation's denominator).
    pub peak_tflops: f64,
    /// `tflops / peak` in (0, 1].
    pub utilization: f64,
    /// "compute", "memory" or "collective".
    pub bound: &'static str,
    /// Named breakdown figures (seconds unless the name says otherwise).
    pub details: Vec<(&'static str, f64)>,
    /// Spans for the Chrome/Perfetto trace (empty unless a trace was asked for).
    pub events: Vec<Event>,
    /// How far the published cases of this kind were from the model (none for kinds without
    /// published cases, such as single instructions).
    pub uncertainty: Option<Uncertainty>,
}

impl Report {
    /// An empty report of `operation`.
    pub fn new(operation: &'static str) -> Self {
        Report {
            operation,
            description: String::new(),
            instructions: 0,
            pe_cycles: 0,
            cycles: 0.0,
            seconds: 0.0,
            flops: 0.0,
            tflops: 0.0,
            pe_tflops: 0.0,
            peak_tflops: 0.0,
            utilization: 0.0,
            bound: "compute",
            details: Vec::new(),
            events: Vec::new(),
            uncertainty: Uncertainty::for_operation(operation),
        }
    }

    /// The events as a Chrome trace-event JSON document (opens in Perfetto and
    /// chrome://tracing): one thread per track, times in microseconds, every slice with its
    /// `args`, and an "HBM bandwidth" counter track (GB/s) from the spans' `hbm_bytes`.
    pub fn chrome_trace_json(&self) -> String {
        let mut tracks: Vec<&'static str> = Vec::new();
        for e in &self.events {
            if !tracks.contains(&e.track) {
                tracks.push(e.track);
            }
        }
        let mut s = String::with_capacity(64 + self.events.len() * 96);
        s.push_str("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
        s.push_str("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"trn2core NeuronCore-v3\"}}");
        for (i, t) in tracks.iter().enumerate() {
            s.push_str(&format!(
                ",{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":{i},\"args\":{{\"name\":\"{t}\"}}}}"
            ));
        }
        for e in &self.events {
            let tid = tracks.iter().position(|t| *t == e.track).unwrap_or(0);
            s.push_str(&format!(
                ",{{\"ph\":\"X\",\"name\":\"{}\",\"pid\":0,\"tid\":{tid},\"ts\":{:.6},\"dur\":{:.6},",
                e.name,
                e.start_s * 1e6,
                e.dur_s * 1e6
            ));
            write_json_args(&mut s, &e.args);
            s.push('}');
        }
        // HBM bandwidth over time: the transfers that cross HBM, each at its average rate.
        let hbm: Vec<(f64, f64, f64)> = self
            .events
            .iter()
            .filter_map(|e| {
                e.args
                    .iter()
                    .find(|(k, _)| *k == "hbm_bytes")
                    .map(|&(_, b)| (e.start_s, e.dur_s, b))
            })
            .collect();
        write_bandwidth_counter(&mut s, 0, "HBM bandwidth", &hbm);
        s.push_str("]}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `(ts, GB/s)` points of a counter written by [`write_bandwidth_counter`].
    fn points(spans: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
        let mut s = String::new();
        write_bandwidth_counter(&mut s, 0, "bw", spans);
        s.split(",{")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let num = |key: &str| -> f64 {
                    let at = e.find(key).map_or(0, |i| i + key.len());
                    let end = e[at..].find(['}', ',']).map_or(e.len(), |j| at + j);
                    e[at..end].parse().unwrap_or(f64::NAN)
                };
                (num("\"ts\":"), num("\"GB/s\":"))
            })
            .collect()
    }

    #[test]
    fn bandwidth_counter_sums_overlapping_spans_and_ends_at_zero() {
        // 2 GB over [0, 1) s and 1 GB over [0.5, 1.5) s: 2, then 3, then 1, then 0 GB/s.
        let p = points(&[(0.0, 1.0, 2e9), (0.5, 1.0, 1e9)]);
        assert_eq!(p, vec![(0.0, 2.0), (0.5e6, 3.0), (1.0e6, 1.0), (1.5e6, 0.0)]);
        assert!(points(&[(0.0, 0.0, 5.0), (1.0, 1.0, 0.0)]).is_empty());
    }

    #[test]
    fn args_are_json_numbers() {
        let mut s = String::new();
        write_json_args(&mut s, &[("bank", 3.0), ("bytes", 0.5), ("bad", f64::NAN)]);
        assert_eq!(s, "\"args\":{\"bank\":3,\"bytes\":0.5,\"bad\":null}");
    }
}
