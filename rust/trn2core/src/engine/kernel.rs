//! Register-blocked micro-kernels of the GEMM driver: one K tile of an `MR x NR` block of the
//! output, from packed panels.
//!
//! Every output element lives in its own SIMD lane (rows in separate registers, columns across
//! lanes) and takes its products one k at a time, in the packed order, through a fused
//! multiply-add (`VFMADD231PS`, or `f32::mul_add` in the portable kernel). An FMA *is* the
//! engine's PE step (see the module doc of [`crate::engine`]), so the kernels are bit-exact for
//! every input, whatever the blocking, the instruction set or the thread that runs them.
//!
//! The tile's partial sums start at +0.0 (zeroed registers) and are then written to the output
//! (the first K tile) or added to it with one fp32 rounding (every later K tile). The last K
//! tile of a product stores every NaN as the canonical NaN (`canon`), in registers, instead of
//! a pass over the output afterwards: the pass cost a twentieth of a one-matmul settle.

/// The largest `MR` of any kernel: the length of the row-pointer array the driver passes.
pub(crate) const MAX_MR: usize = 16;

/// A micro-kernel. Holding a value proves the CPU supports its instructions.
pub(crate) trait MicroKernel: Copy + Send + Sync {
    /// Rows of the register block (rows of the packed A micro-panel).
    const MR: usize;
    /// Columns of the register block (columns of the packed B micro-panel).
    const NR: usize;

    /// Computes one K tile of `kc` products for an `MR x NR` output block.
    ///
    /// `a` is an `MR`-row micro-panel packed k-major (`a[k * MR + i]`), `b` an `NR`-column
    /// micro-panel packed k-major (`b[k * NR + j]`); both in the tile's product order. `c[i]`
    /// points at the first column of output row `i`, or is null for a padding row that is not
    /// stored; only the first `cols` (`1..=NR`) columns are stored. With `first` the tile sums
    /// are written, otherwise added to what `c` holds; with `canon` every NaN stored is
    /// [`super::CANONICAL_NAN`] (any other value is stored as computed).
    ///
    /// # Safety
    /// `a` must be valid for `kc * MR` reads, `b` for `kc * NR` reads, each non-null `c[i]` for
    /// reads and writes of `cols` elements, none of them aliasing `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        self, kc: usize, a: *const f32, b: *const f32, c: &[*mut f32; MAX_MR], cols: usize,
        first: bool, canon: bool,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.run_tile(KTile { kc, a, b, c, cols, first, canon }) }
    }

    /// [`MicroKernel::run`] with its operands in one value.
    ///
    /// # Safety
    /// As [`MicroKernel::run`].
    unsafe fn run_tile(self, t: KTile<'_>);
}

/// The operands of one K tile (see [`MicroKernel::run`]).
#[derive(Clone, Copy)]
pub(crate) struct KTile<'a> {
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: &'a [*mut f32; MAX_MR],
    cols: usize,
    first: bool,
    canon: bool,
}

/// The portable kernel: `f32::mul_add` is IEEE `fusedMultiplyAdd` on every target (a hardware
/// FMA where there is one, a correctly rounded library routine otherwise).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

const PORTABLE_MR: usize = 4;
const PORTABLE_NR: usize = 8;

impl MicroKernel for Portable {
    const MR: usize = PORTABLE_MR;
    const NR: usize = PORTABLE_NR;

    unsafe fn run_tile(self, t: KTile<'_>) {
        let KTile { kc, a, b, c, cols, first, canon } = t;
        // SAFETY: the caller's contract covers `kc * MR` and `kc * NR` reads.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(a, kc * PORTABLE_MR),
                std::slice::from_raw_parts(b, kc * PORTABLE_NR),
            )
        };
        let mut acc = [[0f32; PORTABLE_NR]; PORTABLE_MR];
        for (ak, bk) in a.chunks_exact(PORTABLE_MR).zip(b.chunks_exact(PORTABLE_NR)) {
            for (row, &x) in acc.iter_mut().zip(ak) {
                for (s, &y) in row.iter_mut().zip(bk) {
                    *s = x.mul_add(y, *s);
                }
            }
        }
        for (row, &p) in acc.iter().zip(c) {
            if p.is_null() {
                continue;
            }
            // SAFETY: a non-null row pointer is valid for `cols` reads and writes.
            let out = unsafe { std::slice::from_raw_parts_mut(p, cols) };
            for (o, &s) in out.iter_mut().zip(row) {
                let v = if first { s } else { *o + s };
                *o = if canon && v.is_nan() { super::CANONICAL_NAN } else { v };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

// AVX-512 intrinsics and target features are stable since Rust 1.89; the crate already needs
// that for the AVX-512 target features of `numerics::encode`.
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86 {
    use super::{KTile, MicroKernel};
    use std::arch::x86_64::*;

    /// AVX-512 kernel: 6 rows x 4 vectors of 16 columns. 24 accumulators, 4 B vectors and one
    /// broadcast fill 29 of the 32 zmm registers; per k it issues 24 FMAs against 10 loads.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Avx512(());

    /// AVX2 kernel: 6 rows x 2 vectors of 8 columns (12 accumulators of the 16 ymm registers).
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Avx2(());

    const AVX512_MR: usize = 6;
    const AVX512_NV: usize = 4;
    const AVX2_MR: usize = 6;
    const AVX2_NV: usize = 2;

    impl Avx512 {
        /// The kernel, if this CPU has AVX-512F and FMA.
        pub(crate) fn detect() -> Option<Avx512> {
            (is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma"))
            .then_some(Avx512(()))
        }
    }

    impl Avx2 {
        /// The kernel, if this CPU has AVX2 and FMA.
        pub(crate) fn detect() -> Option<Avx2> {
            (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
                .then_some(Avx2(()))
        }
    }

    /// `MicroKernel` for `$kernel`: `$mr` rows of `$nv` registers of `$lanes`, the tile compiled
    /// with the target features `$features`.
    macro_rules! simd_kernel {
        ($kernel:ident, $lanes:ty, $mr:expr, $nv:expr, $features:literal) => {
            impl MicroKernel for $kernel {
                const MR: usize = $mr;
                const NR: usize = $nv * <$lanes as Lanes>::W;

                unsafe fn run_tile(self, t: KTile<'_>) {
                    /// # Safety
                    /// The CPU must have the features; the rest as [`tile`].
                    #[target_feature(enable = $features)]
                    unsafe fn compiled(t: KTile<'_>) {
                        // SAFETY: this function enables the features; the rest is the
                        // caller's contract.
                        unsafe { tile::<$lanes, { $mr }, { $mr }, { $nv }>(t) }
                    }
                    /// A block's last micro-panel, of `rows < MR` rows (see `live_rows`): a
                    /// function of its own, so that the full block's code stays as it is.
                    ///
                    /// # Safety
                    /// As `compiled`, with only the first `rows` row pointers read.
                    #[target_feature(enable = $features)]
                    unsafe fn compiled_rows(rows: usize, t: KTile<'_>) {
                        // SAFETY (each arm): as `compiled`; ROWS <= MR is checked when the arm
                        // compiles.
                        unsafe {
                            match rows {
                                1 => tile::<$lanes, { $mr }, 1, { $nv }>(t),
                                2 => tile::<$lanes, { $mr }, 2, { $nv }>(t),
                                3 => tile::<$lanes, { $mr }, 3, { $nv }>(t),
                                4 => tile::<$lanes, { $mr }, 4, { $nv }>(t),
                                5 => tile::<$lanes, { $mr }, 5, { $nv }>(t),
                                _ => tile::<$lanes, { $mr }, { $mr }, { $nv }>(t),
                            }
                        }
                    }
                    let rows = live_rows::<{ $mr }>(t.c);
                    // SAFETY (both calls): holding `self` proves the CPU has the features; the
                    // rest is the caller's contract.
                    if rows < $mr {
                        return unsafe { compiled_rows(rows, t) };
                    }
                    unsafe { compiled(t) }
                }
            }
        };
    }

    simd_kernel!(Avx512, Zmm, AVX512_MR, AVX512_NV, "avx512f,avx2,fma");
    simd_kernel!(Avx2, Ymm, AVX2_MR, AVX2_NV, "avx2,fma");

    /// The vector operations a register-blocked tile needs, in one instruction set's registers.
    ///
    /// Every method is `#[inline(always)]` and must only run inlined into a function that
    /// enables the instruction set (the `# Safety` of each).
    trait Lanes {
        /// A register of `W` f32 lanes.
        type V: Copy;
        /// A mask of a register's first lanes.
        type M: Copy;
        /// Lanes per register.
        const W: usize;
        /// Whether the output block is prefetched before the K loop of a later K tile.
        const PREFETCH: bool;
        unsafe fn zero() -> Self::V;
        unsafe fn load(p: *const f32) -> Self::V;
        unsafe fn splat(x: f32) -> Self::V;
        /// `a * b + c` with one rounding.
        unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
        /// `v` with every NaN lane the canonical NaN.
        unsafe fn canon(v: Self::V) -> Self::V;
        /// The mask of the first `valid` (`1..=W`) lanes.
        unsafe fn mask(valid: usize) -> Self::M;
        unsafe fn load_masked(p: *const f32, m: Self::M) -> Self::V;
        unsafe fn store_masked(p: *mut f32, m: Self::M, v: Self::V);
    }

    /// `Lanes` for `$regs` from its intrinsics: five that map one to one, and the mask, masked
    /// load and masked store written out (their operands differ in order between the sets).
    macro_rules! lanes {
        (
            $regs:ident: $v:ty, $m:ty, $w:expr, prefetch $prefetch:expr;
            $zero:ident, $load:ident, $splat:ident, $fma:ident, $add:ident;
            canon($cv:ident) $canon:expr;
            mask($valid:ident) $mask:expr;
            load_masked($lp:ident, $lm:ident) $load_masked:expr;
            store_masked($sp:ident, $sm:ident, $sv:ident) $store_masked:expr;
        ) => {
            impl Lanes for $regs {
                type V = $v;
                type M = $m;
                const W: usize = $w;
                const PREFETCH: bool = $prefetch;
                // SAFETY (every block): inlined where the instruction set is enabled (the
                // trait's contract); pointers as the caller says.
                #[inline(always)]
                unsafe fn zero() -> $v {
                    unsafe { $zero() }
                }
                #[inline(always)]
                unsafe fn load(p: *const f32) -> $v {
                    unsafe { $load(p) }
                }
                #[inline(always)]
                unsafe fn splat(x: f32) -> $v {
                    unsafe { $splat(x) }
                }
                #[inline(always)]
                unsafe fn fma(a: $v, b: $v, c: $v) -> $v {
                    unsafe { $fma(a, b, c) }
                }
                #[inline(always)]
                unsafe fn add(a: $v, b: $v) -> $v {
                    unsafe { $add(a, b) }
                }
                #[inline(always)]
                unsafe fn canon($cv: $v) -> $v {
                    unsafe { $canon }
                }
                #[inline(always)]
                unsafe fn mask($valid: usize) -> $m {
                    #[allow(unused_unsafe)]
                    unsafe {
                        $mask
                    }
                }
                #[inline(always)]
                unsafe fn load_masked($lp: *const f32, $lm: $m) -> $v {
                    unsafe { $load_masked }
                }
                #[inline(always)]
                unsafe fn store_masked($sp: *mut f32, $sm: $m, $sv: $v) {
                    unsafe { $store_masked }
                }
            }
        };
    }

    /// AVX-512F registers.
    struct Zmm;

    /// AVX2 registers.
    struct Ymm;

    lanes! {
        Zmm: __m512, __mmask16, 16, prefetch true;
        _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps;
        canon(v) _mm512_mask_mov_ps(
            v,
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v),
            _mm512_set1_ps(crate::engine::CANONICAL_NAN)
        );
        mask(valid) ((1u32 << valid) - 1) as u16;
        load_masked(p, m) _mm512_maskz_loadu_ps(m, p);
        store_masked(p, m, v) _mm512_mask_storeu_ps(p, m, v);
    }

    lanes! {
        Ymm: __m256, __m256i, 8, prefetch false;
        _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps;
        canon(v) _mm256_blendv_ps(
            v,
            _mm256_set1_ps(crate::engine::CANONICAL_NAN),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)
        );
        // Lanes below `valid` are all ones: maskload/maskstore touch only those.
        mask(valid) _mm256_cmpgt_epi32(
            _mm256_set1_epi32(valid as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
        );
        load_masked(p, m) _mm256_maskload_ps(p, m);
        store_masked(p, m, v) _mm256_maskstore_ps(p, m, v);
    }

    /// How many rows of an `MR`-row block [`tile`] computes: the count of leading non-null row
    /// pointers when every pointer after them is null (a block's last micro-panel: a 128-row
    /// output is 21 panels of 6 rows and one of 2, whose 4 padding rows are then not
    /// computed), else `MR`.
    #[inline(always)]
    fn live_rows<const MR: usize>(c: &[*mut f32; super::MAX_MR]) -> usize {
        let rows = c[..MR].iter().take_while(|p| !p.is_null()).count();
        if c[rows..MR].iter().all(|p| p.is_null()) {
            rows.max(1)
        } else {
            MR
        }
    }

    /// One K tile of the first `ROWS` rows of an `MR x NV * L::W` block in `L`'s registers:
    /// `ROWS x NV` accumulators, `NV` B registers and one broadcast A element per k; the A
    /// panel has `MR` rows (`ROWS < MR`: its last rows are padding, neither computed nor
    /// stored). Each row's sums are those of the full block: rows never mix.
    ///
    /// # Safety
    /// Inlined into a function that enables `L`'s instruction set (as [`Lanes`] says); pointers
    /// as in [`MicroKernel::run`] with `MR` rows and `NV * L::W` columns, of which the first
    /// `ROWS` (`<= MR`) are read from `c`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // index loops on purpose (see the FMA loop)
    unsafe fn tile<L: Lanes, const MR: usize, const ROWS: usize, const NV: usize>(t: KTile<'_>) {
        const { assert!(ROWS >= 1 && ROWS <= MR) };
        let KTile { kc, a, b, c, cols, first, canon } = t;
        if L::PREFETCH && !first {
            // The output block is read only after the K loop: start fetching it now.
            for &p in c.iter().take(ROWS).filter(|p| !p.is_null()) {
                for j in 0..NV {
                    // SAFETY: a prefetch never faults; SSE is part of x86-64.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(L::W * j) as *const i8) };
                }
            }
        }
        // SAFETY (every block below): `L`'s instructions are enabled (this function's contract).
        let mut acc = [[unsafe { L::zero() }; NV]; ROWS];
        for k in 0..kc {
            // SAFETY: k < kc, so the panels hold these MR and NV * W elements.
            let (ak, bk) = unsafe { (a.add(k * MR), b.add(k * NV * L::W)) };
            let mut bv = [unsafe { L::zero() }; NV];
            for (j, v) in bv.iter_mut().enumerate() {
                // SAFETY: within the B panel row (see above).
                *v = unsafe { L::load(bk.add(L::W * j)) };
            }
            // Index loops over the fixed-size arrays: they unroll and inline in any build
            // (an iterator adapter such as `zip` may be left as a call when the crate is
            // compiled in several units without LTO, as `make test`'s profile does).
            for i in 0..ROWS {
                // SAFETY: within the A panel row (see above; ROWS <= MR).
                let x = unsafe { L::splat(*ak.add(i)) };
                for j in 0..NV {
                    // One fused multiply-add: the PE step, exactly.
                    acc[i][j] = unsafe { L::fma(x, bv[j], acc[i][j]) };
                }
            }
        }
        for j in 0..NV {
            let valid = cols.saturating_sub(L::W * j).min(L::W);
            if valid == 0 {
                break;
            }
            let mask = unsafe { L::mask(valid) };
            for i in 0..ROWS {
                let (row, p) = (&acc[i], c[i]);
                if p.is_null() {
                    continue;
                }
                // SAFETY: the row holds `cols` elements and the mask covers only those.
                unsafe {
                    let p = p.add(L::W * j);
                    let v = if first { row[j] } else { L::add(L::load_masked(p, mask), row[j]) };
                    L::store_masked(p, mask, if canon { L::canon(v) } else { v });
                }
            }
        }
    }
}

/// Whether this thread's floating-point environment is IEEE's default: round to nearest even,
/// subnormal inputs honoured (no DAZ) and subnormal results kept (no FTZ). The kernels' bits
/// are only the engine's bits under it. Checked by arithmetic the optimiser cannot fold.
pub(crate) fn fp_env_is_ieee() -> bool {
    use std::hint::black_box;
    let tiny = black_box(f32::from_bits(1)); // 2^-149, the smallest subnormal
    let one = black_box(1.0f32);
    // 0.75 ulp(1): nearest rounds away from 1 in both directions; any directed mode does not
    // in at least one of them.
    let three_quarter_ulp = black_box(0.75 * f32::EPSILON);
    let no_daz = (tiny * one).to_bits() == 1;
    let no_ftz = (tiny * black_box(1.5f32)).to_bits() == 2; // inexact and tiny: RNE gives 2^-148
    let nearest = one + three_quarter_ulp == 1.0 + f32::EPSILON
        && -one - three_quarter_ulp == -1.0 - f32::EPSILON;
    no_daz && no_ftz && nearest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block of a 5-step tile with the rows `stored` (the others' pointers null), checked
    /// against pe_fma per element; the column past `cols` and the rows not stored must stay
    /// untouched. `a` holds a NaN with a payload, so that some sums are NaN: stored as computed
    /// without `canon`, as the canonical NaN with it.
    fn run_block<K: MicroKernel>(kernel: K, stored: &[usize]) {
        let kc = 5;
        let mut a: Vec<f32> = (0..kc * K::MR).map(|i| (i as f32 - 7.5) * 0.37).collect();
        a[2 * K::MR + 1] = f32::from_bits(0xFFC0_1234);
        let b: Vec<f32> = (0..kc * K::NR).map(|i| (i as f32 * 0.11).sin()).collect();
        let cols = K::NR - 1;
        let mut out = vec![vec![1.25f32; K::NR]; K::MR];
        for (first, canon) in [(true, false), (false, false), (true, true), (false, true)] {
            let before = out.clone();
            let mut ptrs = [std::ptr::null_mut(); MAX_MR];
            for (i, row) in out.iter_mut().enumerate() {
                if stored.contains(&i) {
                    ptrs[i] = row.as_mut_ptr();
                }
            }
            // SAFETY: panels of the right sizes; rows hold NR >= cols elements.
            unsafe { kernel.run(kc, a.as_ptr(), b.as_ptr(), &ptrs, cols, first, canon) };
            for i in 0..K::MR {
                if !stored.contains(&i) {
                    assert!(out[i].iter().all(|&x| x == 1.25), "row {i} not stored: untouched");
                    continue;
                }
                for j in 0..cols {
                    let mut s = 0f32;
                    for k in 0..kc {
                        s = crate::engine::pe_fma(s, a[k * K::MR + i], b[k * K::NR + j]);
                    }
                    let want = if first { s } else { before[i][j] + s };
                    let got = out[i][j];
                    assert_eq!(got.is_nan(), want.is_nan(), "{stored:?}: row {i} col {j}");
                    if canon && want.is_nan() {
                        assert_eq!(got.to_bits(), super::super::CANONICAL_NAN.to_bits());
                    } else if !want.is_nan() {
                        assert_eq!(got.to_bits(), want.to_bits(), "{stored:?}: row {i} col {j}");
                    }
                }
                // Only row 1 takes the NaN of `a`.
                assert!(out[i][..cols].iter().all(|x| x.is_nan() == (i == 1)), "row {i}");
                assert_eq!(out[i][cols], 1.25, "column past `cols` untouched");
            }
            if stored.contains(&1) && canon {
                assert!(out[1][..cols].iter().all(|x| x.to_bits() == 0x7FC0_0000), "row 1 all NaN");
            }
            // The next round starts from sums without NaN payloads of their own.
            for row in &mut out {
                row.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = 1.5);
            }
        }
    }

    /// Every count of leading rows (a block's last micro-panel computes only those), and rows
    /// that are not a prefix (the whole block is computed, the null rows not stored).
    fn run_kernel<K: MicroKernel>(kernel: K) {
        for rows in 1..=K::MR {
            run_block(kernel, &(0..rows).collect::<Vec<_>>());
        }
        run_block(kernel, &[0, 2]);
        run_block(kernel, &[1]);
        run_block(kernel, &[]);
    }

    #[test]
    fn kernels_agree_with_the_scalar_step() {
        run_kernel(Portable);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(k) = Avx512::detect() {
                run_kernel(k);
            }
            if let Some(k) = Avx2::detect() {
                run_kernel(k);
            }
        }
    }

    #[test]
    fn default_environment_is_ieee() {
        assert!(fp_env_is_ieee());
    }
}
