//! DMA timing (trn2_facts.md section 9): 16 DMA engines per NeuronCore work on every transfer
//! (a transfer uses one queue id across all 16 engines; each engine serves 8 partitions), a
//! fixed cost per transfer (~1.3 us: descriptor setup, synchronisation, semaphore-to-start,
//! [S13]), a per-partition size efficiency (full rate from about 4 KiB per partition, severely
//! overhead-bound below 256 B, [S12][S13]), the per-engine rate, and HBM bandwidth as the shared
//! limit. With inline compression the HBM side moves the compressed (`wire`) bytes while the
//! engines still move the raw bytes on the SBUF side.
//!
//! Efficiency model: `e(s) = s / (s + 256 B)` for `s` bytes per partition (our fit to the
//! documented curve: 50% at 256 B, 89% at 2 KiB, 94% at 4 KiB and above). Engine rate: the
//! theoretical 27.2 GB/s per engine ([S12] text; 16 x 27.2 = 435 GB/s per core, 128 engines =
//! the chip's documented 3.5 TB/s). HBM: a core alone on its stack may use the whole stack
//! (725 GB/s); the other die's stacks cost `NUMA_REMOTE_*` (an assumption, see `spec`).

use super::report::{Event, Report};
use crate::spec::{
    DMA_ENGINES_PER_CORE, DMA_ENGINE_THEORETICAL_BYTES_PER_S, DMA_FIXED_COST_S,
    DMA_OVERHEAD_BOUND_PARTITION_BYTES, HBM_STACK_BYTES_PER_S, NUMA_REMOTE_BANDWIDTH_FACTOR,
    NUMA_REMOTE_EXTRA_LATENCY_S, SBUF_PARTITIONS,
};
use crate::{Error, Result};

/// Where a transfer reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// HBM on this core's die.
    Hbm,
    /// HBM on the other die (NUMA).
    HbmRemote,
    Sbuf,
    Psum,
}

impl Place {
    /// Parses `"hbm"`, `"hbm_remote"`, `"sbuf"`, `"psum"`.
    pub fn parse(arg: &str, name: &str) -> Result<Place> {
        match name {
            "hbm" => Ok(Place::Hbm),
            "hbm_remote" => Ok(Place::HbmRemote),
            "sbuf" => Ok(Place::Sbuf),
            "psum" => Ok(Place::Psum),
            other => Err(Error::value(
                arg,
                format!("unknown memory {other:?}; expected \"hbm\", \"hbm_remote\", \"sbuf\" or \"psum\""),
            )),
        }
    }
    fn is_hbm(self) -> bool {
        matches!(self, Place::Hbm | Place::HbmRemote)
    }
}

/// A DMA transfer to cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DmaPlan {
    /// Raw bytes delivered.
    pub bytes: u64,
    /// Bytes crossing HBM (compressed size when a codec is used; else `bytes`).
    pub wire_bytes: u64,
    /// Partitions the on-chip side spans (128 for a full SBUF tile).
    pub partitions: u64,
    pub src: Place,
    pub dst: Place,
}

/// Fraction of the engines' rate a transfer with `partition_bytes` per partition reaches.
pub fn dma_efficiency(partition_bytes: f64) -> f64 {
    let knee = DMA_OVERHEAD_BOUND_PARTITION_BYTES as f64;
    if partition_bytes <= 0.0 {
        return 0.0;
    }
    partition_bytes / (partition_bytes + knee)
}

/// Peak DMA rate of one core's 16 engines, bytes/s.
pub fn engines_bytes_per_s() -> f64 {
    DMA_ENGINES_PER_CORE as f64 * DMA_ENGINE_THEORETICAL_BYTES_PER_S
}

/// Costs one transfer; the report's `details` say which limit bound it.
pub fn dma_time(plan: &DmaPlan) -> Result<Report> {
    if plan.partitions == 0 || plan.partitions > SBUF_PARTITIONS as u64 {
        return Err(Error::shape(
            "partitions",
            format!(
                "got {}; a transfer spans 1..={SBUF_PARTITIONS} partitions",
                plan.partitions
            ),
        ));
    }
    let remote = plan.src == Place::HbmRemote || plan.dst == Place::HbmRemote;
    let hbm_touched = plan.src.is_hbm() || plan.dst.is_hbm();
    let per_partition = plan.bytes as f64 / plan.partitions as f64;
    let eff = dma_efficiency(per_partition).max(1e-9);
    // Only the engines serving the spanned partitions work (8 partitions each).
    let engines_used = (plan.partitions as f64
        / (SBUF_PARTITIONS as f64 / DMA_ENGINES_PER_CORE as f64))
        .ceil()
        .clamp(1.0, DMA_ENGINES_PER_CORE as f64);
    let engine_rate = engines_used * DMA_ENGINE_THEORETICAL_BYTES_PER_S * eff;
    let engine_s = plan.bytes as f64 / engine_rate;
    let hbm_rate = HBM_STACK_BYTES_PER_S
        * if remote {
            NUMA_REMOTE_BANDWIDTH_FACTOR
        } else {
            1.0
        };
    let hbm_bytes = if hbm_touched {
        plan.wire_bytes as f64
    } else {
        0.0
    };
    let hbm_s = hbm_bytes / hbm_rate;
    let fixed = DMA_FIXED_COST_S
        + if remote {
            NUMA_REMOTE_EXTRA_LATENCY_S
        } else {
            0.0
        };
    let stream = engine_s.max(hbm_s);
    let seconds = if plan.bytes == 0 {
        fixed
    } else {
        fixed + stream
    };
    let mut r = Report::new("dma");
    r.description = format!(
        "DMA {:?} -> {:?}: {} B ({} B over HBM) across {} partitions",
        plan.src, plan.dst, plan.bytes, plan.wire_bytes, plan.partitions
    );
    r.seconds = seconds;
    r.cycles = seconds * crate::spec::PE_CLOCK_HZ;
    r.bound = "memory";
    r.details = vec![
        ("fixed_s", fixed),
        ("engines_s", engine_s),
        ("hbm_s", hbm_s),
        ("efficiency", eff),
    ];
    r.events = vec![
        Event::new("DMA queue 0", "descriptor/semaphore", 0.0, fixed),
        Event::new("DMA queue 0", "transfer", fixed, seconds - fixed),
    ];
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(bytes: u64, src: Place) -> DmaPlan {
        DmaPlan {
            bytes,
            wire_bytes: bytes,
            partitions: 128,
            src,
            dst: Place::Sbuf,
        }
    }

    #[test]
    fn large_transfers_approach_the_engines_rate_and_small_ones_pay_the_fixed_cost() {
        let big = dma_time(&plan(64 << 20, Place::Hbm)).expect("ok");
        let bw = (64u64 << 20) as f64 / big.seconds;
        assert!(
            bw > 0.9 * engines_bytes_per_s() && bw <= engines_bytes_per_s(),
            "{bw}"
        );
        let small = dma_time(&plan(128 * 64, Place::Hbm)).expect("ok");
        assert!(small.seconds < 1.1 * DMA_FIXED_COST_S + 1e-6);
        assert!(
            small.details[0].1 / small.seconds > 0.9,
            "fixed cost dominates"
        );
    }

    #[test]
    fn remote_hbm_and_compression() {
        let local = dma_time(&plan(256 << 20, Place::Hbm)).expect("ok");
        let remote = dma_time(&plan(256 << 20, Place::HbmRemote)).expect("ok");
        assert!(remote.seconds > local.seconds);
        let mut p = plan(256 << 20, Place::HbmRemote);
        p.wire_bytes = 64 << 20;
        let compressed = dma_time(&p).expect("ok");
        assert!(compressed.seconds < remote.seconds);
        assert_eq!(dma_efficiency(256.0), 0.5);
    }
}
