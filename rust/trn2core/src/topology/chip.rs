//! One Trainium2 chip and its Logical NeuronCores (\[S1\]\[S3\]\[S6\]\[S25\]), and the instance
//! types built from chips.
//!
//! A chip has 8 physical NeuronCore-v3 on two compute dies (cores 0-3 on die 0, 4-7 on die 1) and
//! four HBM stacks, each shared by an adjacent pair of cores (stack `s` serves cores `2s` and
//! `2s + 1`). A Logical NeuronCore groups `lnc` adjacent physical cores: LNC=1 is every core on
//! its own, LNC=2 (the Trn2 default) the pairs that share a stack, and LNC=4 a whole die. AWS
//! documents LNC 1 and 2 for Trn2; 4 is this product's extension (see `spec::LNC_MAX`).
//!
//! A logical core has `lnc` times one core's tensor engine, SBUF and share of HBM bandwidth.

use std::ops::Range;

use crate::engine::PerfMode;
use crate::numerics::Format;
use crate::spec::{
    CHIPS_PER_INSTANCE, CHIPS_PER_TRN2_3XLARGE, CORES_PER_CHIP, CORES_PER_DIE, CORES_PER_HBM_STACK,
    CORE_PEAK_BF16_FLOPS_PER_S, CORE_PEAK_FP32_FLOPS_PER_S, CORE_PEAK_FP8_DOUBLE_ROW_FLOPS_PER_S,
    CORE_PEAK_SPARSE_FLOPS_PER_S, HBM_CORE_SHARE_BYTES_PER_S, HBM_STACK_BYTES, INSTANCE_TORUS_X,
    INSTANCE_TORUS_Y, LNC_ALLOWED, LNC_DEFAULT, SBUF_BYTES,
};
use crate::{Error, Result};

/// Checks a Logical NeuronCore size (1, 2 or 4).
pub fn check_lnc(lnc: usize) -> Result<()> {
    if LNC_ALLOWED.contains(&lnc) {
        Ok(())
    } else {
        Err(Error::value(
            "lnc",
            format!(
                "got {lnc}; a Logical NeuronCore groups {LNC_ALLOWED:?} physical cores \
                 (AWS documents 1 and 2, default {LNC_DEFAULT}; 4 is a trn2core extension)"
            ),
        ))
    }
}

/// Logical cores per chip at `lnc`.
pub fn logical_cores_per_chip(lnc: usize) -> usize {
    CORES_PER_CHIP / lnc.max(1)
}

/// The physical cores (indices 0..8) of logical core `index` at `lnc`: adjacent cores, so a
/// logical core never spans the two dies and LNC=2 pairs are exactly the HBM-stack pairs.
pub fn logical_core_members(lnc: usize, index: usize) -> Result<Range<usize>> {
    check_lnc(lnc)?;
    let n = logical_cores_per_chip(lnc);
    if index >= n {
        return Err(Error::value(
            "index",
            format!("logical core {index} does not exist; LNC={lnc} gives cores 0..{n}"),
        ));
    }
    Ok(index * lnc..(index + 1) * lnc)
}

/// The compute die (0 or 1) of physical core `core`.
pub fn die_of(core: usize) -> usize {
    core / CORES_PER_DIE
}

/// The HBM stack (0..4) that physical core `core` shares with its neighbour.
pub fn hbm_stack_of(core: usize) -> usize {
    core / CORES_PER_HBM_STACK
}

/// Resources of one logical core of `lnc` physical cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogicalCoreInfo {
    /// Physical cores it groups.
    pub lnc: usize,
    /// SBUF: `lnc` x 28 MiB.
    pub sbuf_bytes: u64,
    /// HBM capacity it owns: `lnc` x half a 24 GiB stack.
    pub hbm_bytes: u64,
    /// Its share of HBM bandwidth: `lnc` x 362.5 GB/s.
    pub hbm_bytes_per_s: f64,
}

impl LogicalCoreInfo {
    /// The resources of a logical core of `lnc` physical cores.
    pub fn new(lnc: usize) -> Result<LogicalCoreInfo> {
        check_lnc(lnc)?;
        Ok(LogicalCoreInfo {
            lnc,
            sbuf_bytes: lnc as u64 * SBUF_BYTES,
            hbm_bytes: lnc as u64 * HBM_STACK_BYTES / CORES_PER_HBM_STACK as u64,
            hbm_bytes_per_s: lnc as f64 * HBM_CORE_SHARE_BYTES_PER_S,
        })
    }

    /// `peak_flops` by the names users write: `dtype` a tensor-engine format name, or
    /// `"sparse"` for the structured-sparsity peak; `perf_mode` double_row only with fp8 e4m3
    /// or e5m2 (without it, fp8 runs at the bf16 rate). `FormatError` naming the argument
    /// otherwise.
    pub fn peak_flops_named(&self, dtype: &str, perf_mode: PerfMode) -> Result<f64> {
        if dtype == "sparse" {
            return Ok(self.peak_flops(Format::Bf16, false, true));
        }
        let format = Format::parse("dtype", dtype)?;
        if format == Format::Fp8E4m3fn {
            return Err(Error::format(
                "dtype",
                "the Trainium2 tensor engine does not take fp8_e4m3fn (OCP E4M3); it has no peak",
            ));
        }
        let fp8_dr = matches!(format, Format::Fp8E4m3 | Format::Fp8E5m2);
        if perf_mode == PerfMode::DoubleRow && !fp8_dr {
            return Err(Error::format(
                "perf_mode",
                format!("double_row needs fp8_e4m3 or fp8_e5m2, not {:?}", format.name()),
            ));
        }
        Ok(self.peak_flops(format, perf_mode == PerfMode::DoubleRow, false))
    }

    /// Dense tensor-engine peak in FLOP/s for operands of `format` (`double_row` for fp8 e4m3 and
    /// e5m2 doubles it; `sparse` is the 4x structured-sparsity peak).
    pub fn peak_flops(&self, format: Format, double_row: bool, sparse: bool) -> f64 {
        let one = if sparse {
            CORE_PEAK_SPARSE_FLOPS_PER_S
        } else {
            match format {
                Format::Fp32 => CORE_PEAK_FP32_FLOPS_PER_S,
                Format::Fp8E4m3 | Format::Fp8E5m2 if double_row => {
                    CORE_PEAK_FP8_DOUBLE_ROW_FLOPS_PER_S
                }
                _ => CORE_PEAK_BF16_FLOPS_PER_S,
            }
        };
        self.lnc as f64 * one
    }
}

/// An EC2 instance type built from Trainium2 chips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceType {
    /// EC2 name.
    pub name: &'static str,
    /// Chips.
    pub chips: usize,
    /// Extents of its NeuronLink torus (empty for one chip).
    pub torus: &'static [usize],
    /// Whether it can join an UltraServer (the Z links are cabled).
    pub ultraserver_capable: bool,
}

/// The Trn2 instance types: one chip, and the two 16-chip 4 x 4 torus instances.
pub const INSTANCE_TYPES: [InstanceType; 3] = [
    InstanceType {
        name: "trn2.3xlarge",
        chips: CHIPS_PER_TRN2_3XLARGE,
        torus: &[],
        ultraserver_capable: false,
    },
    InstanceType {
        name: "trn2.48xlarge",
        chips: CHIPS_PER_INSTANCE,
        torus: &[INSTANCE_TORUS_X, INSTANCE_TORUS_Y],
        ultraserver_capable: false,
    },
    InstanceType {
        name: "trn2u.48xlarge",
        chips: CHIPS_PER_INSTANCE,
        torus: &[INSTANCE_TORUS_X, INSTANCE_TORUS_Y],
        ultraserver_capable: true,
    },
];

/// Looks up an instance type by its EC2 name.
pub fn instance_type(name: &str) -> Result<InstanceType> {
    INSTANCE_TYPES.iter().copied().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<&str> = INSTANCE_TYPES.iter().map(|t| t.name).collect();
        Error::value(
            "instance_type",
            format!("unknown instance type {name:?}; expected one of {names:?}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_cores_group_adjacent_cores_on_one_die() {
        for lnc in LNC_ALLOWED {
            for i in 0..logical_cores_per_chip(lnc) {
                let m = logical_core_members(lnc, i).expect("exists");
                assert_eq!(m.len(), lnc);
                assert_eq!(die_of(m.start), die_of(m.end - 1));
            }
        }
        assert_eq!(logical_core_members(2, 3).expect("ok"), 6..8);
        assert_eq!(hbm_stack_of(6), hbm_stack_of(7));
        assert!(logical_core_members(2, 4).is_err());
        assert!(check_lnc(3).is_err());
    }

    #[test]
    fn logical_core_resources_scale_with_lnc() {
        let one = LogicalCoreInfo::new(1).expect("ok");
        let two = LogicalCoreInfo::new(2).expect("ok");
        assert_eq!(two.sbuf_bytes, 2 * one.sbuf_bytes);
        assert_eq!(two.sbuf_bytes, 56 << 20);
        assert_eq!(two.hbm_bytes, HBM_STACK_BYTES);
        assert_eq!(two.hbm_bytes_per_s, 725e9);
        assert_eq!(two.peak_flops(Format::Bf16, false, false), 2.0 * CORE_PEAK_BF16_FLOPS_PER_S);
    }

    #[test]
    fn instance_types_match_the_spec() {
        for t in INSTANCE_TYPES {
            assert_eq!(t.torus.iter().product::<usize>(), t.chips);
        }
        assert_eq!(
            instance_type("trn2.48xlarge").expect("ok").torus,
            &[INSTANCE_TORUS_X, INSTANCE_TORUS_Y]
        );
        assert!(instance_type("trn1.32xlarge").is_err());
    }
}
