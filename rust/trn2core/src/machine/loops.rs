//! Loop-carried reads in a recorded program: which instructions of a loop's iteration read
//! bytes whose last writer belongs to an earlier iteration of the same loop.
//!
//! NKI's legacy `affine_range` tells the compiler that its iterations are independent, so it may
//! reorder and pipeline them; only associative accumulations (matmuls accumulating into one PSUM
//! tile) may cross iterations (the NKI language docs of `affine_range`, Neuron 2.26). A front end
//! that issues a loop's instructions in program order can find every other read across
//! iterations here and report it instead of silently serialising the loop. The analysis reads
//! only the recorded [`Program`] (regions, in issue order): neither values nor time.
//!
//! Regions of strided access patterns are their bounding byte ranges per partition (as in the
//! timeline), so two interleaved strided patterns count as overlapping; a caller that needs the
//! exact answer checks the reported pairs' tiles.

use std::collections::BTreeMap;

use crate::{Error, Result};

use super::ranges::Ranges;
use super::record::{Program, Region};
use super::tile::partition_mask;

/// Per memory: disjoint byte ranges, each with `[(partition mask, last writer)]`.
#[derive(Debug, Default)]
struct LastWriters {
    segs: Ranges<(u128, u32)>,
}

impl LastWriters {
    /// Records that `id` wrote `(mask, lo..hi)`.
    fn write(&mut self, mask: u128, lo: u64, hi: u64, id: u32) {
        for entries in self.segs.cover(lo, hi) {
            entries.retain_mut(|e| {
                e.0 &= !mask;
                e.0 != 0
            });
            entries.push((mask, id));
        }
    }

    /// Calls `f(writer)` for every last writer of `(mask, lo..hi)` issued before `before`.
    fn earlier(&self, mask: u128, lo: u64, hi: u64, before: u32, mut f: impl FnMut(u32)) {
        for entries in self.segs.overlapping(lo, hi) {
            for &(m, w) in entries {
                if m & mask != 0 && w < before {
                    f(w);
                }
            }
        }
    }
}

fn mask_of(r: &Region) -> u128 {
    partition_mask(r.p0 as u32, r.pn as u32)
}

/// The loop-carried reads of one loop: `iterations` are the indices of the first instruction
/// of each iteration (ascending), `end` is one past the loop's last instruction. Returns up to
/// `limit` pairs `(reader, writer)`, in issue order of the readers: `reader` (in iteration k)
/// reads bytes last written by `writer` in an earlier iteration of this loop. Writes before the
/// loop do not count (reading data prepared outside the loop is what loops do).
pub fn carried_reads(
    program: &Program, iterations: &[usize], end: usize, limit: usize,
) -> Result<Vec<(u32, u32)>> {
    let n = program.instrs.len();
    let Some(&start) = iterations.first() else {
        return Ok(Vec::new());
    };
    if end > n || start > end || iterations.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::value(
            "iterations",
            format!(
                "iteration starts {iterations:?} and end {end} do not describe a range of the \
                 {n} recorded instructions in order"
            ),
        ));
    }
    let mut mems: BTreeMap<u32, LastWriters> = BTreeMap::new();
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut k = 0usize;
    for i in start..end {
        while k + 1 < iterations.len() && iterations[k + 1] <= i {
            k += 1;
        }
        let before = iterations[k] as u32;
        let instr = &program.instrs[i];
        for r in program.reads(instr) {
            if let Some(m) = mems.get(&r.mem) {
                let mut found = Vec::new();
                m.earlier(mask_of(r), r.lo, r.hi, before, |w| found.push(w));
                found.sort_unstable();
                found.dedup();
                for w in found {
                    if !out.iter().any(|&(ri, wi)| ri == i as u32 && wi == w) {
                        out.push((i as u32, w));
                        if out.len() >= limit {
                            return Ok(out);
                        }
                    }
                }
            }
        }
        for r in program.writes(instr) {
            mems.entry(r.mem).or_default().write(mask_of(r), r.lo, r.hi, i as u32);
        }
    }
    Ok(out)
}
