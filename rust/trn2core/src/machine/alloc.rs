//! The allocator of SBUF and PSUM: where a tensor goes ([`Memories::alloc`], [`Memories::free`]),
//! how full each memory is ([`Memories::usage`]), and the reservations `core.alloc` hands out
//! ([`OnChip`]). The bytes themselves, the tensor table and initialisation tracking are in
//! [`memory`](super::memory).
//!
//! An allocation takes the same byte range `[address, address + bytes)` on a run of partitions
//! (NKI's tensors: the first axis on partitions, the rest in each partition). The allocator is
//! first-fit by address over the allocations that share a partition, 64-byte aligned (our
//! choice; the compiler's policy is not published), up to the usable 212,984 B of an SBUF
//! partition. A PSUM allocation of at most one bank never crosses a bank boundary; a larger one
//! starts on a bank boundary.

use crate::memory::{fmt_bytes, Allocation, Footprint, OnChip, Space, Usage};
use crate::spec::{
    PSUM_BANK_BYTES, PSUM_PARTITIONS, PSUM_PARTITION_BYTES, SBUF_PARTITIONS, SBUF_PARTITION_BYTES,
    SBUF_USABLE_PARTITION_BYTES,
};
use crate::{Error, Result};

use super::dtype::Dtype;
use super::memory::{Live, Memories, Uninitialized, ALIGN_BYTES};
use super::tile::{partition_mask, TensorId};

impl Memories {
    /// Allocates a tensor of `shape` (partitions first) in SBUF or PSUM, at `address` if given
    /// (bytes within each partition), else first-fit. Errors: `CapacityError` with the bytes
    /// asked, the free bytes per partition and the largest live allocations. With `overlay`
    /// (an explicit `address` only) the tensor may overlap other overlay tensors and holds the
    /// bytes already there (they keep their written state): NKI's explicit allocations, where two tensors placed on the same bytes are the same
    /// memory. It still may not overlap a first-fit tensor, and must fit (`CapacityError`).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc(
        &mut self, space: Space, name: &str, shape: &[usize], dtype: Dtype, start_partition: u32,
        address: Option<u64>, overlay: bool,
    ) -> Result<TensorId> {
        self.alloc_or(space, name, shape, dtype, start_partition, address, overlay, true)
    }

    /// [`Memories::alloc`]; with `explain` false, a tensor that does not fit is a
    /// `CapacityError` without its message (the free bytes and largest allocations cost some
    /// 50 us to gather), for a caller that makes room and asks again, never for the user
    /// (`Machine::try_alloc_at`, whose PSUM allocations find the memory full at every wave of
    /// a matmul kernel).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn alloc_or(
        &mut self, space: Space, name: &str, shape: &[usize], dtype: Dtype, start_partition: u32,
        address: Option<u64>, overlay: bool, explain: bool,
    ) -> Result<TensorId> {
        if overlay && address.is_none() {
            return Err(Error::value(
                "address",
                format!("{name}: an overlay tensor needs an explicit address"),
            ));
        }
        let (limit, parts) = match space {
            Space::Sbuf => (SBUF_USABLE_PARTITION_BYTES, SBUF_PARTITIONS),
            Space::Psum => (PSUM_PARTITION_BYTES, PSUM_PARTITIONS),
            Space::Hbm => {
                return Err(Error::value(
                    "space",
                    "HBM tensors are created from host data or with hbm_tensor, not alloc",
                ))
            }
        };
        Self::elements("shape", shape)?;
        let p = shape[0];
        if p > parts || start_partition as usize + p > parts {
            return Err(Error::shape(
                "shape",
                format!(
                    "{name}: partition dimension {p} from partition {start_partition} exceeds \
                     the {parts} partitions of {} (the first axis of an on-chip tensor is its \
                     partition axis)",
                    space.name()
                ),
            ));
        }
        let free: u64 = shape[1..].iter().map(|&s| s as u64).product();
        let bytes = free.saturating_mul(dtype.size() as u64);
        let live = match space {
            Space::Sbuf => &self.live_sbuf,
            _ => &self.live_psum,
        };
        let too_big = || {
            if explain {
                self.capacity_error(space, name, shape, dtype, bytes, start_partition, p, limit)
            } else {
                Error::capacity("shape", String::new())
            }
        };
        let address = match address {
            Some(a) => {
                let end = a.saturating_add(bytes);
                let clash = live.iter().find(|l| {
                    !(overlay && l.overlay)
                        && overlaps(l.start_partition, l.partitions, start_partition, p as u32)
                        && l.address < end
                        && a < l.address + l.bytes
                });
                if end > limit {
                    return Err(too_big());
                }
                if let Some(l) = clash {
                    let other =
                        self.tensors[l.slot as usize].as_ref().map_or("?", |t| t.name.as_str());
                    return Err(Error::value(
                        "address",
                        format!(
                            "{name}: bytes {a}..{end} on partitions {start_partition}..{} \
                             overlap the live tensor {other} (bytes {}..{})",
                            start_partition as usize + p,
                            l.address,
                            l.address + l.bytes
                        ),
                    ));
                }
                if space == Space::Psum && !psum_placement_ok(a, bytes) {
                    return Err(Error::value(
                        "address",
                        format!(
                            "{name}: a PSUM tensor of {bytes} B per partition at byte {a} \
                             crosses a {PSUM_BANK_BYTES}-byte bank boundary (one bank or less \
                             must stay inside its bank; more must start on a bank boundary)"
                        ),
                    ));
                }
                a
            }
            None => match self.fit_address(space, start_partition, p as u32, bytes, limit) {
                Some(a) => a,
                None => return Err(too_big()),
            },
        };
        let slot = self.new_slot();
        let live = Live { slot, start_partition, partitions: p as u32, address, bytes, overlay };
        let mask = partition_mask(start_partition, p as u32);
        // An overlay tensor's bytes are those already there: no fresh (unwritten) state.
        match space {
            Space::Sbuf => {
                insert_by_address(&mut self.live_sbuf, live);
                if !overlay {
                    self.sbuf_init.clear(mask, address, address + bytes);
                }
            }
            _ => {
                insert_by_address(&mut self.live_psum, live);
                if !overlay {
                    self.psum_init.clear(mask, address, address + bytes);
                }
            }
        }
        if self.uninitialized == Uninitialized::Nan && !overlay {
            self.fill_on_chip(space, start_partition, p, address, bytes, 0xFF);
        }
        let place = (start_partition, p as u32, address, bytes);
        self.put_on_chip(slot, name, space, dtype, shape, place);
        Ok(self.id(slot))
    }

    /// Where [`Memories::alloc`] puts a tensor of `bytes` per partition on partitions
    /// `start_partition..+p` without an address: first fit (SBUF from the top when
    /// `sbuf_from_top`), `None` when nothing fits.
    fn fit_address(
        &self, space: Space, start_partition: u32, p: u32, bytes: u64, limit: u64,
    ) -> Option<u64> {
        let live = self.live(space);
        if space == Space::Sbuf && self.sbuf_from_top {
            top_fit(live, start_partition, p, bytes, limit)
        } else {
            first_fit(live, space, start_partition, p, bytes, limit)
        }
    }

    /// Whether [`Memories::alloc`] of `shape` and `dtype` in `space` from partition 0, without
    /// an address, could succeed now: `false` only when it would be the `CapacityError` of
    /// no room (made here without its message; a front end trying again as memory is freed).
    pub fn has_room(&self, space: Space, shape: &[usize], dtype: Dtype) -> bool {
        let (limit, parts) = Self::limits(space);
        if space == Space::Hbm || Self::elements("shape", shape).is_err() || shape[0] > parts {
            return true; // the allocation's own error, not one of room
        }
        let free: u64 = shape[1..].iter().map(|&s| s as u64).product();
        let bytes = free.saturating_mul(dtype.size() as u64);
        self.fit_address(space, 0, shape[0] as u32, bytes, limit).is_some()
    }

    /// The usable bytes per partition and the partitions of SBUF or PSUM.
    fn limits(space: Space) -> (u64, usize) {
        match space {
            Space::Psum => (PSUM_PARTITION_BYTES, PSUM_PARTITIONS),
            _ => (SBUF_USABLE_PARTITION_BYTES, SBUF_PARTITIONS),
        }
    }

    fn live(&self, space: Space) -> &[Live] {
        match space {
            Space::Psum => &self.live_psum,
            _ => &self.live_sbuf,
        }
    }

    /// How full SBUF or PSUM is, as this allocator places tensors: capacity the usable bytes
    /// (SBUF: the compiler's 212,984 B of each 224 KiB partition), used the bytes of the live
    /// tensors (overlay tensors each count), `partition_free` the largest first-fit size a
    /// tensor over every partition could still take.
    pub fn usage(&self, space: Space) -> Usage {
        let (limit, parts) = Self::limits(space);
        let live = self.live(space);
        let capacity = limit * parts as u64;
        let used: u64 = live.iter().map(|l| l.bytes * l.partitions as u64).sum();
        Usage {
            capacity,
            used,
            free: capacity.saturating_sub(used),
            partitions: parts as u64,
            partition_bytes: limit,
            partition_free: largest_gap(live, space, parts as u32, limit),
            allocations: live.len(),
        }
    }

    /// The lowest first partition from which `fp` fits now (first fit over the partitions,
    /// then over the bytes), if any.
    pub(crate) fn lowest_fit(&self, space: Space, fp: Footprint) -> Option<u32> {
        let (limit, parts) = Self::limits(space);
        let p = u32::try_from(fp.partitions).ok()?;
        let live = self.live(space);
        (0..=(parts as u32).checked_sub(p)?)
            .find(|&s| first_fit(live, space, s, p, fp.partition_bytes, limit).is_some())
    }

    /// The owner tag of this machine's reservations (`memory::Allocation::owner`): apart from
    /// every `CoreMemory`'s (those count up from 1 below 2^63).
    pub(crate) fn owner(&self) -> u64 {
        (1 << 63) | self.machine as u64
    }

    /// The reservation a live SBUF/PSUM tensor stands for (`core.alloc`'s handle).
    pub(crate) fn allocation(&self, id: TensorId, stack: usize) -> Result<Allocation> {
        let t = self.tensor(id)?;
        Ok(Allocation {
            space: t.space,
            id: (id.generation as u64) << 32 | id.slot as u64,
            bytes: t.bytes * t.partitions as u64,
            partition_start: t.start_partition as u64,
            partitions: t.partitions as u64,
            partition_bytes: t.bytes,
            stack,
            owner: self.owner(),
        })
    }

    /// The tensor of a reservation made here, if it is live; `ValueError` naming `allocation`
    /// when another memory made it or it was freed.
    pub(crate) fn reserved(&self, a: &Allocation) -> Result<TensorId> {
        if a.owner != self.owner() || a.space == Space::Hbm {
            return Err(Error::value(
                "allocation",
                format!(
                    "{} allocation {} was made by another core's memory, not this core's; free \
                     it on the core that allocated it",
                    a.space.name(),
                    a.id
                ),
            ));
        }
        let id =
            TensorId { machine: self.machine, slot: a.id as u32, generation: (a.id >> 32) as u32 };
        match self.tensor(id) {
            Ok(t) if t.space == a.space => Ok(id),
            _ => Err(Error::value(
                "allocation",
                format!(
                    "{} allocation {} is not live (already freed?)",
                    a.space.name().to_uppercase(),
                    a.id
                ),
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn capacity_error(
        &self, space: Space, name: &str, shape: &[usize], dtype: Dtype, bytes: u64, start: u32,
        p: usize, limit: u64,
    ) -> Error {
        let live = match space {
            Space::Sbuf => &self.live_sbuf,
            _ => &self.live_psum,
        };
        // Free bytes per partition: the usable size minus what live allocations take there.
        let mut used = vec![0u64; p];
        for l in live {
            for (q, u) in used.iter_mut().enumerate() {
                let q = start as usize + q;
                if q >= l.start_partition as usize
                    && q < (l.start_partition + l.partitions) as usize
                {
                    *u += l.bytes;
                }
            }
        }
        let min_free = used.iter().map(|u| limit.saturating_sub(*u)).min().unwrap_or(0);
        let max_free = used.iter().map(|u| limit.saturating_sub(*u)).max().unwrap_or(0);
        let mut biggest: Vec<&Live> = live.iter().collect();
        biggest.sort_by_key(|l| std::cmp::Reverse(l.bytes * l.partitions as u64));
        let largest: Vec<String> = biggest
            .iter()
            .take(3)
            .map(|l| {
                let n = self.tensors[l.slot as usize].as_ref().map_or("?", |t| t.name.as_str());
                format!(
                    "{n} ({} x {} partitions at byte {})",
                    fmt_bytes(l.bytes),
                    l.partitions,
                    l.address
                )
            })
            .collect();
        let physical = match space {
            Space::Sbuf => format!(
                " ({} usable per partition of the physical {})",
                fmt_bytes(limit),
                fmt_bytes(SBUF_PARTITION_BYTES)
            ),
            _ => format!(" ({} per partition)", fmt_bytes(limit)),
        };
        Error::capacity(
            "shape",
            format!(
                "{name} {shape:?} {dtype} needs {} per partition on partitions {start}..{} but \
                 {} has {}..{} free there{physical}, and no free range of that size; largest \
                 live allocations: {}",
                fmt_bytes(bytes),
                start as usize + p,
                space.name(),
                fmt_bytes(min_free),
                fmt_bytes(max_free),
                if largest.is_empty() { "none".to_string() } else { largest.join(", ") }
            ),
        )
        .with_rule(match space {
            Space::Sbuf => "sbuf_capacity",
            _ => "psum_capacity",
        })
    }

    /// Frees a tensor; its handles become invalid. The bytes keep their contents (a new tensor
    /// there starts as never written).
    pub fn free(&mut self, id: TensorId) -> Result<()> {
        let t = self.tensor(id)?;
        if t.space == Space::Hbm && !self.lazy.is_empty() {
            self.fill_lazy(id, true, false); // spill slots whose bytes are still its rows
        }
        let t = self.tensor(id)?;
        let space = t.space;
        match space {
            Space::Sbuf => self.live_sbuf.retain(|l| l.slot != id.slot),
            Space::Psum => self.live_psum.retain(|l| l.slot != id.slot),
            Space::Hbm => {}
        }
        self.tensors[id.slot as usize] = None;
        self.free_slots.push(id.slot);
        Ok(())
    }

    /// Frees a tensor whose bytes queued work still writes or reads (the machine's matmul
    /// queue, [`super::Machine::free`]): its tiles are invalid from now on, as after
    /// [`Memories::free`], but its bytes stay taken (no allocation lands on them) until
    /// [`Memories::reclaim`], when the queue has been settled.
    pub fn retire(&mut self, id: TensorId) -> Result<()> {
        if self.tensor(id)?.space == Space::Hbm {
            self.fill_lazy(id, true, false);
        }
        self.tensors[id.slot as usize] = None;
        self.retired.push(id.slot);
        Ok(())
    }

    /// Frees a tensor whose storage a front end gives up to another (NKI's current dialect,
    /// where the compiler reuses a tensor's memory after its last use): a later use of one of
    /// its tiles is a `CapacityError` with `message` and `rule`, not the usual freed-tensor
    /// error.
    pub fn give_up(&mut self, id: TensorId, message: String, rule: &'static str) -> Result<()> {
        self.free(id)?;
        self.given_up.push((id, message, rule));
        Ok(())
    }

    /// Whether retired tensors still take bytes.
    pub fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// Gives the bytes of the retired tensors back.
    pub fn reclaim(&mut self) {
        for slot in std::mem::take(&mut self.retired) {
            self.live_sbuf.retain(|l| l.slot != slot);
            self.live_psum.retain(|l| l.slot != slot);
            self.free_slots.push(slot);
        }
    }
}

impl OnChip for Memories {
    fn fits_ever(&self, arg: &str, space: Space, fp: Footprint) -> Result<()> {
        let (limit, parts) = Self::limits(space);
        if fp.partitions > parts as u64 || fp.partition_bytes > limit {
            let name = space.name().to_uppercase();
            let usable = if space == Space::Sbuf {
                format!(" usable (of the physical {})", fmt_bytes(SBUF_PARTITION_BYTES))
            } else {
                String::new()
            };
            return Err(Error::capacity(
                arg,
                format!(
                    "{} over {} partitions needs {} per partition; {name} has {parts} \
                     partitions of {}{usable}",
                    fmt_bytes(fp.bytes),
                    fp.partitions,
                    fmt_bytes(fp.partition_bytes),
                    fmt_bytes(limit)
                ),
            )
            .with_rule(if space == Space::Sbuf {
                "sbuf_capacity"
            } else {
                "psum_capacity"
            }));
        }
        Ok(())
    }

    fn fits_now(&self, arg: &str, space: Space, fp: Footprint) -> Result<()> {
        self.fits_ever(arg, space, fp)?;
        if self.lowest_fit(space, fp).is_some() {
            return Ok(());
        }
        let u = self.usage(space);
        Err(Error::capacity(
            arg,
            format!(
                "{} over {} partitions needs {} free on {} consecutive partitions; {} has at \
                 most {} free on every partition ({} used of {} in {} allocations)",
                fmt_bytes(fp.bytes),
                fp.partitions,
                fmt_bytes(fp.partition_bytes),
                fp.partitions,
                space.name().to_uppercase(),
                fmt_bytes(u.partition_free),
                fmt_bytes(u.used),
                fmt_bytes(u.capacity),
                u.allocations
            ),
        )
        .with_rule(if space == Space::Sbuf { "sbuf_capacity" } else { "psum_capacity" }))
    }

    fn holds_on_chip(&self, a: &Allocation) -> bool {
        self.reserved(a).is_ok()
    }
}

/// The largest size (bytes per partition) a first-fit tensor over every partition could take.
fn largest_gap(live: &[Live], space: Space, parts: u32, limit: u64) -> u64 {
    // The sizes that could fit are monotone: search the largest by bisection.
    let (mut lo, mut hi) = (0u64, limit);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if first_fit(live, space, 0, parts, mid, limit).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Whether partition ranges `[a, a + n)` and `[b, b + m)` overlap.
fn overlaps(a: u32, n: u32, b: u32, m: u32) -> bool {
    a < b + m && b < a + n
}

/// Whether a PSUM allocation of `bytes` per partition at `address` respects the banks.
fn psum_placement_ok(address: u64, bytes: u64) -> bool {
    if bytes <= PSUM_BANK_BYTES {
        address / PSUM_BANK_BYTES == (address + bytes - 1) / PSUM_BANK_BYTES
    } else {
        address.is_multiple_of(PSUM_BANK_BYTES)
    }
}

/// Adds `l` to a memory's live allocations, kept in order of their byte ranges (`retain` keeps
/// that order): [`taken`]'s sort then finds them in order, in one pass, instead of sorting the
/// hundred or so tensors a kernel keeps live at every allocation.
fn insert_by_address(live: &mut Vec<Live>, l: Live) {
    let key = (l.address, l.address + l.bytes);
    let at = live.partition_point(|x| (x.address, x.address + x.bytes) <= key);
    live.insert(at, l);
}

/// The byte ranges `[lo, hi)` the allocations on any of partitions `[start, start + p)` take,
/// in address order.
fn taken(live: &[Live], start: u32, p: u32) -> Vec<(u64, u64)> {
    let mut taken: Vec<(u64, u64)> = live
        .iter()
        .filter(|l| overlaps(l.start_partition, l.partitions, start, p))
        .map(|l| (l.address, l.address + l.bytes))
        .collect();
    taken.sort_unstable();
    taken
}

/// The lowest aligned address where `bytes` fit on partitions `[start, start + p)`.
fn first_fit(
    live: &[Live], space: Space, start: u32, p: u32, bytes: u64, limit: u64,
) -> Option<u64> {
    let taken = taken(live, start, p);
    let align = |a: u64| a.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
    let place = |a: u64| -> u64 {
        let a = align(a);
        if space == Space::Psum && !psum_placement_ok(a, bytes) {
            a.div_ceil(PSUM_BANK_BYTES) * PSUM_BANK_BYTES
        } else {
            a
        }
    };
    let mut cand = place(0);
    for (lo, hi) in taken {
        if cand + bytes <= lo {
            break;
        }
        if hi > cand {
            cand = place(hi);
        }
    }
    (cand + bytes <= limit).then_some(cand)
}

/// The highest aligned SBUF address where `bytes` fit on partitions `[start, start + p)`
/// below `limit` (the same sizes fit as with [`first_fit`]; only the place differs).
fn top_fit(live: &[Live], start: u32, p: u32, bytes: u64, limit: u64) -> Option<u64> {
    // Disjoint, in address order.
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (lo, hi) in taken(live, start, p) {
        match merged.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    let down = |a: u64| a / ALIGN_BYTES * ALIGN_BYTES;
    let mut upper = limit;
    for &(lo, hi) in merged.iter().rev() {
        if upper >= bytes && down(upper - bytes) >= hi {
            return Some(down(upper - bytes));
        }
        upper = upper.min(lo);
    }
    (upper >= bytes).then(|| down(upper - bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_tensors_share_bytes_with_each_other_only() -> Result<()> {
        let mut m = Memories::new(Uninitialized::Error)?;
        let (sb, f32) = (Space::Sbuf, Dtype::Fp32);
        let a = m.alloc(sb, "a", &[128, 64], f32, 0, Some(1024), true)?;
        // Another overlay on a's bytes is the same memory; a first-fit tensor avoids both.
        m.alloc(sb, "b", &[64, 32], f32, 32, Some(1100), true)?;
        let c = m.alloc(sb, "c", &[128, 512], f32, 0, None, false)?;
        assert_eq!(m.tensor(c)?.address, 1024 + 256);
        let d = m.alloc(sb, "d", &[128, 8], f32, 0, None, false)?;
        assert_eq!(m.tensor(d)?.address, 0);
        // An overlay may not land on a first-fit tensor, nor a plain placement on an overlay.
        let e = m.alloc(sb, "e", &[1, 4], f32, 0, Some(1300), true);
        assert!(e.is_err());
        assert!(m.alloc(sb, "f", &[1, 4], f32, 0, Some(1024), false).is_err());
        assert!(m.alloc(sb, "g", &[1, 4], f32, 0, None, true).is_err());
        m.free(a)
    }

    #[test]
    fn top_fit_takes_the_highest_gap_that_holds_the_tensor() -> Result<()> {
        let mut m = Memories::new(Uninitialized::Error)?;
        m.sbuf_from_top = true;
        let (sb, u8) = (Space::Sbuf, Dtype::Uint8);
        let a = m.alloc(sb, "a", &[128, 100], u8, 0, None, false)?;
        let top = (SBUF_USABLE_PARTITION_BYTES - 100) / ALIGN_BYTES * ALIGN_BYTES;
        assert_eq!(m.tensor(a)?.address, top);
        // An explicit placement from address 0 up (nki-library's SbufManager) stays clear.
        m.alloc(sb, "low", &[128, 4096], u8, 0, Some(0), true)?;
        let b = m.alloc(sb, "b", &[64, 64], u8, 64, None, false)?;
        assert_eq!(m.tensor(b)?.address, m.tensor(a)?.address - 64);
        // The gap between 4096 and b is the only one left for this size.
        let big = m.tensor(b)?.address - 4096;
        let c = m.alloc(sb, "c", &[128, big as usize], u8, 0, None, false)?;
        assert_eq!(m.tensor(c)?.address, 4096);
        assert!(m.alloc(sb, "d", &[128, 64], u8, 0, None, false).is_err());
        // PSUM keeps first fit.
        let ps = m.alloc(Space::Psum, "ps", &[128, 8], Dtype::Fp32, 0, None, false)?;
        assert_eq!(m.tensor(ps)?.address, 0);
        Ok(())
    }

    #[test]
    fn first_fit_and_psum_banks() {
        let live = vec![Live {
            slot: 0,
            start_partition: 0,
            partitions: 128,
            address: 0,
            bytes: 100,
            overlay: false,
        }];
        assert_eq!(first_fit(&live, Space::Sbuf, 0, 128, 64, 1000), Some(128));
        assert_eq!(first_fit(&live, Space::Psum, 0, 128, 2000, 16384), Some(2048));
        assert_eq!(first_fit(&live, Space::Psum, 0, 128, 1900, 16384), Some(128));
        assert_eq!(first_fit(&live, Space::Psum, 0, 128, 1990, 2048), None);
        assert!(psum_placement_ok(2048, 4096));
        assert!(!psum_placement_ok(1024, 2048));
    }

    #[test]
    fn reservations_and_tensors_share_one_account() -> Result<()> {
        use crate::machine::{Machine, MachineConfig};
        let mut m = Machine::new(MachineConfig::default())?;
        let sb = Space::Sbuf;
        let t = m.alloc(sb, "t", &[128, 1024], Dtype::Fp32)?;
        let fp = Footprint::of_bytes(128 * 200_000);
        let (a, _) = m.reserve("size", sb, "a", fp, None, 0)?;
        assert_eq!((a.partitions, a.partition_bytes, a.bytes), (128, 200_000, 128 * 200_000));
        let u = m.memories().usage(sb);
        assert_eq!((u.used, u.allocations), (128 * (4096 + 200_000), 2));
        // 4096..204096 taken; 204096..212984 left.
        assert_eq!(u.partition_free, SBUF_USABLE_PARTITION_BYTES - 204_096);
        let left = Footprint::of_shape(&[128, u.partition_free], 1)?;
        assert!(m.memories().fits_now("x", sb, left).is_ok());
        let over = Footprint::of_shape(&[128, u.partition_free + 1], 1)?;
        let e = m.memories().fits_now("x", sb, over).expect_err("one byte too many");
        assert_eq!((e.arg(), e.rule()), (Some("x"), Some("sbuf_capacity")));
        // A one-partition tensor goes to the lowest partition where it fits.
        let row = Footprint::of_shape(&[1, 8_000], 1)?;
        let (b, _) = m.reserve("size", sb, "b", row, Some((&[1, 8_000], Dtype::Uint8)), 0)?;
        assert_eq!(b.partition_start, 0);
        let (c, _) = m.reserve("size", sb, "c", row, Some((&[1, 8_000], Dtype::Uint8)), 0)?;
        assert_eq!(c.partition_start, 1);
        m.release(&a)?;
        assert!(m.release(&a).is_err(), "a second release is refused");
        assert!(!m.memories().holds_on_chip(&a));
        assert!(m.memories().holds_on_chip(&b));
        // Another machine's reservation is not this one's.
        let mut other = Machine::new(MachineConfig::default())?;
        let (o, _) = other.reserve("size", sb, "o", Footprint::of_bytes(128), None, 0)?;
        assert!(m.release(&o).is_err() && !m.memories().holds_on_chip(&o));
        m.free(&t)?;
        assert_eq!(m.memories().usage(sb).allocations, 2);
        Ok(())
    }
}
