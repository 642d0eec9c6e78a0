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
}

impl Event {
    /// An event on `track` from `start_s` lasting `dur_s` seconds.
    pub fn new(track: &'static str, name: &'static str, start_s: f64, dur_s: f64) -> Self {
        Event {
            track,
            name,
            start_s,
            dur_s,
        }
    }
}

/// How far published Trainium2 measurements of this kind of operation were from the model's
/// predictions of them: every published case's time lay between `low x` and `high x` the
/// predicted time (the calibration residuals; benches/fidelity.py, docs/fidelity.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uncertainty {
    /// Smallest published / predicted ratio.
    pub low: f64,
    /// Largest published / predicted ratio.
    pub high: f64,
    /// Published cases the range is taken over.
    pub cases: usize,
    /// Which published cases: `"collective"`, `"dma"` or `"gemm"`.
    pub basis: &'static str,
}

impl Uncertainty {
    /// The range of the published collective cases (nccom-test rows).
    pub const COLLECTIVE: Uncertainty = Uncertainty {
        low: COLLECTIVE_PUBLISHED_RATIO_LOW,
        high: COLLECTIVE_PUBLISHED_RATIO_HIGH,
        cases: COLLECTIVE_PUBLISHED_CASES,
        basis: "collective",
    };
    /// The range of the published DMA transfers.
    pub const DMA: Uncertainty = Uncertainty {
        low: DMA_PUBLISHED_RATIO_LOW,
        high: DMA_PUBLISHED_RATIO_HIGH,
        cases: DMA_PUBLISHED_CASES,
        basis: "dma",
    };
    /// The range of the published GEMM kernels.
    pub const GEMM: Uncertainty = Uncertainty {
        low: GEMM_PUBLISHED_RATIO_LOW,
        high: GEMM_PUBLISHED_RATIO_HIGH,
        cases: GEMM_PUBLISHED_CASES,
        basis: "gemm",
    };

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

    /// `"published cases within -12%/+8% (17 cases)"`.
    pub fn text(&self) -> String {
        let pct = |r: f64| {
            let p = (r - 1.0) * 100.0;
            if p.abs() < 0.5 {
                "0%".to_string()
            } else {
                format!("{p:+.0}%")
            }
        };
        format!(
            "published cases within {}/{} ({} {} case{})",
            pct(self.low),
            pct(self.high),
            self.cases,
            self.basis,
            if self.cases == 1 { "" } else { "s" }
        )
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
    /// chrome://tracing): one thread per track, times in microseconds.
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
                ",{{\"ph\":\"X\",\"name\":\"{}\",\"pid\":0,\"tid\":{tid},\"ts\":{:.6},\"dur\":{:.6}}}",
                e.name,
                e.start_s * 1e6,
                e.dur_s * 1e6
            ));
        }
        s.push_str("]}");
        s
    }
}
