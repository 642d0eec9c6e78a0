//! Every Trainium2 hardware number trn2core uses, once, with its unit and its source.
//!
//! This module is the single source of truth for the hardware: clocks, array and memory
//! sizes, bandwidths, latencies, instruction-cost parameters, topology and limits. No other
//! file in the project may hold a hardware number; everything else reads it from here, and the
//! Python binding exposes the same values read-only as `trn2core.spec` (see [`ENTRIES`]).
//!
//! # Sources and status tags
//!
//! Every constant names its sources by tag, `[S1]`…`[S40]` (public AWS documents and
//! repositories) and `[P]` (the product description trn2core was specified from, used only where
//! no AWS document gives a number: the per-link NeuronLink bandwidths, the single-chip
//! trn2.3xlarge, LNC=4). [`SOURCES`] gives each tag's title, address and the version read; the
//! project's `docs/sources.md` lists the same rows, and [`source`] looks one up.
//!
//! The status letter after the tags is defined in [`STATUSES`]: **D** documented (the cited
//! source states the value), **I** inferred or derived by us (a modelling assumption), **C** the
//! sources conflict (the value chosen and the reason are given in the constant's doc comment).
//!
//! One more status, **calibrated** (in [`STATUSES`]), with the tag `[F]`: a physically
//! named term whose value was fitted to published Trainium2 measurements (the table
//! `benches/fidelity/published.toml`, docs/fidelity.md). Its doc comment names the points it was
//! fitted on; `python benches/fidelity_table.py --fit` recomputes it from them
//! (`tests/test_fidelity.py` checks that the value here is the fit's, rounded), and `--loo`
//! predicts each point with the term refitted without it.
//!
//! # How conflicts were resolved
//!
//! * **Clocks win over marketing.** Per-core peaks are *computed* from the 2.4 GHz PE clock
//!   ([`CORE_PEAK_BF16_FLOPS_PER_S`] = 128 × 128 × 2 × 2.4 GHz = 78.6 TFLOPS); the rounded
//!   per-core figures (79/158/20/316) and the chip marketing figures (667/1299/181/2563, which
//!   are not 8× any per-core figure) are kept as separate constants for reports only.
//! * **HBM bandwidth 2.9 TB/s per chip**: stated by the chip page, the instance page
//!   (46.4 TB/s / 16) and the launch docs; only the current NKI guide says 3 TB/s.
//! * **DMA 23 B/ns per engine effective** (the tables, and a measured 32 KiB transfer), with the
//!   27.2 GB/s "theoretical" text value kept as its own constant.
//! * **16 CC cores per chip** (current chip page, and 2 per physical core); 20 is the older text.
//! * **SBUF 224 KiB per partition** (28 MiB per core); 212,984 B usable per partition is what the
//!   compiler allocates from; "256 KiB per partition" is the Trainium3 value.
//! * **NeuronLink per link**: X/Y 128 GB/s and Z 64 GB/s per direction, from `[P]`. An equal
//!   split of the documented total (256/128 GB/s per link) is not used; with two directions per
//!   link, 4 × 128 × 2 = 1024 GB/s intra-instance and 2 × 64 × 2 = 256 GB/s inter-instance add
//!   up to the documented 1.28 TB/s per chip.
//! * **LNC 1 and 2 are documented; 4 is a product extension** ([`LNC_MAX`]).
//!
//! Names carry their unit (`_HZ`, `_BYTES`, `_BYTES_PER_S`, `_S`, `_CYCLES`, `_TFLOPS`, …).
//! Counts and byte sizes are integers (`usize` for counts and element dimensions, `u64` for
//! bytes); rates, times, clocks and fractions are `f64`.

// ---------------------------------------------------------------------------------------------
// Table machinery: each constant is written once; the macro emits the `pub const` (with its doc
// comment, plus a generated "Unit / source" line) and its row in `ENTRIES`. The first line of
// each doc comment is the one-sentence `doc` of the row; the name is the lower-cased identifier.
// ---------------------------------------------------------------------------------------------

/// ASCII-lower-cases the first `N` bytes of `s` (used at compile time for entry names).
const fn ascii_lowercase<const N: usize>(s: &str) -> [u8; N] {
    let bytes = s.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i].to_ascii_lowercase();
        i += 1;
    }
    out
}

/// `lower_name!(PE_CLOCK_HZ)` is the `&'static str` `"pe_clock_hz"`, computed at compile time.
macro_rules! lower_name {
    ($name:ident) => {{
        const UPPER: &str = stringify!($name);
        const LOWER: [u8; UPPER.len()] = ascii_lowercase(UPPER);
        match ::core::str::from_utf8(&LOWER) {
            Ok(s) => s,
            Err(_) => panic!("constant names are ASCII"),
        }
    }};
}

/// Converts a constant of one of the table's types to `f64` without a same-type cast.
macro_rules! to_f64 {
    (f64, $v:expr) => {
        $v
    };
    (usize, $v:expr) => {
        $v as f64
    };
    (u64, $v:expr) => {
        $v as f64
    };
}

macro_rules! spec_table {
    (
        $(
            #[doc = $summary:literal]
            $(#[doc = $more:literal])*
            #[spec(unit = $unit:literal, source = $source:literal)]
            pub const $name:ident: $ty:ident = $value:expr;
        )*
    ) => {
        $(
            #[doc = $summary]
            $(#[doc = $more])*
            #[doc = ""]
            #[doc = concat!("*Unit:* `", $unit, "`. *Source:* `", $source, "`.")]
            pub const $name: $ty = $value;
        )*

        /// Every scalar constant of this module, in declaration order: the table the Python
        /// binding exposes read-only as `trn2core.spec`.
        pub const ENTRIES: &[SpecEntry] = &[
            $(
                SpecEntry {
                    name: lower_name!($name),
                    value: to_f64!($ty, $name),
                    unit: $unit,
                    source: $source,
                    doc: $summary.trim_ascii(),
                    note: concat!($($more, "\n"),*),
                },
            )*
        ];
    };
}

const KIB: u64 = 1 << 10;
const GIB: u64 = 1 << 30;

spec_table! {
    // ===================================== chip organisation =====================================

    /// Physical NeuronCore-v3 cores per Trainium2 chip.
    #[spec(unit = "count", source = "[S1][S3][S6] D")]
    pub const CORES_PER_CHIP: usize = 8;

    /// Compute dies per chip.
    ///
    /// Driver constant `V3_NUM_DIE_PER_DEVICE 2`; "two compute tiles" `[S29]`.
    #[spec(unit = "count", source = "[S25][S29] D")]
    pub const DIES_PER_CHIP: usize = 2;

    /// Physical cores per compute die.
    ///
    /// Driver: 2 SENG per die × 2 cores per SENG; cores 0–3 on die 0, 4–7 on die 1.
    #[spec(unit = "count", source = "[S25] D")]
    pub const CORES_PER_DIE: usize = CORES_PER_CHIP / DIES_PER_CHIP;

    /// Instruction streams (engine sequencers) per core: Tensor, Vector, Scalar, GpSimd, Sync.
    ///
    /// Driver `V3_TPB_ENG_PER_NC 5`; the mapping to the five engines is inferred. One trace
    /// track per stream.
    #[spec(unit = "count", source = "[S2][S25] D")]
    pub const ENGINE_STREAMS_PER_CORE: usize = 5;

    /// Hardware semaphores per core used to synchronise the engine streams.
    #[spec(unit = "count", source = "[S25] D")]
    pub const SEMAPHORES_PER_CORE: usize = 256;

    /// Collective-communication (CC) cores per chip.
    ///
    /// **Conflict:** 16 `[S3 current][S17: two per physical core]` vs 20
    /// `[S1][S3 before 2025-12-01]`. Chosen 16: it is the current chip page, agrees with
    /// [`CC_CORES_PER_CORE`] × 8, and with the driver's 16 per-core TOP_SP sequencers `[S25]`.
    #[spec(unit = "count", source = "[S3][S17] C")]
    pub const CC_CORES_PER_CHIP: usize = 16;

    /// Collective-communication cores per physical core (4 concurrent CC streams per LNC=2 core).
    #[spec(unit = "count", source = "[S17] D")]
    pub const CC_CORES_PER_CORE: usize = 2;

    // ======================================= HBM and NUMA =======================================

    /// HBM stacks per chip.
    #[spec(unit = "count", source = "[S1][S3][S6] D")]
    pub const HBM_STACKS_PER_CHIP: usize = 4;

    /// HBM stacks attached to each compute die (the die-local half of the chip's HBM).
    ///
    /// Inferred: 4 stacks over 2 dies, each stack shared by 2 adjacent cores of one die. Access to
    /// the other die's stacks is slower (NUMA, `[P]`) but no public source quantifies the penalty.
    #[spec(unit = "count", source = "[S1][S25][S29] I")]
    pub const HBM_STACKS_PER_DIE: usize = HBM_STACKS_PER_CHIP / DIES_PER_CHIP;

    /// Adjacent physical cores sharing one HBM stack (the pair that forms an LNC=2 logical core).
    #[spec(unit = "count", source = "[S1][S6] D")]
    pub const CORES_PER_HBM_STACK: usize = 2;

    /// Capacity of one HBM stack: 24 GiB.
    ///
    /// Driver `V3_HBM_ACTIVE_SIZE 0x600000000` ("each HBM stack is actually 24GB").
    /// **Conflict** noted, not used: "32 GB per NeuronCore on Trn2" `[S18]`.
    #[spec(unit = "B", source = "[S6][S25] D")]
    pub const HBM_STACK_BYTES: u64 = 24 * GIB;

    /// Physical address window reserved per HBM stack (of which 24 GiB are populated).
    ///
    /// Driver `V3_HBM_SIZE`; stack bases `V3_HBM_0..3_BASE` = 0x0, 0x40_0000_0000,
    /// 0x8000_0000_0000, 0x8040_0000_0000.
    #[spec(unit = "B", source = "[S25] D")]
    pub const HBM_STACK_ADDRESS_WINDOW_BYTES: u64 = 64 * GIB;

    /// HBM capacity per chip: 96 GiB.
    #[spec(unit = "B", source = "[S1][S3] D")]
    pub const HBM_CHIP_BYTES: u64 = HBM_STACKS_PER_CHIP as u64 * HBM_STACK_BYTES;

    /// HBM bandwidth per chip: 2.9 TB/s.
    ///
    /// **Conflict:** 2.9 TB/s `[S3][S5: 46.4 TB/s per 16 chips][S27][S1 before 2025-12]` vs
    /// 3 TB/s `[S1 current]`. Chosen 2.9 TB/s: three independent pages agree and the instance
    /// figure is exactly 16 × 2.9.
    #[spec(unit = "B/s", source = "[S3][S5][S27] C")]
    pub const HBM_CHIP_BYTES_PER_S: f64 = 2.9e12;

    /// HBM bandwidth of one stack (chip bandwidth split evenly over the 4 stacks): 725 GB/s.
    #[spec(unit = "B/s", source = "[S3] I")]
    pub const HBM_STACK_BYTES_PER_S: f64 = HBM_CHIP_BYTES_PER_S / HBM_STACKS_PER_CHIP as f64;

    /// Even share of HBM bandwidth per physical core (half a stack): 362.5 GB/s.
    #[spec(unit = "B/s", source = "[S3] I")]
    pub const HBM_CORE_SHARE_BYTES_PER_S: f64 = HBM_STACK_BYTES_PER_S / CORES_PER_HBM_STACK as f64;

    /// Bandwidth factor for HBM on the other die (NUMA): 0.5.
    ///
    /// No public source gives a NUMA figure for Trn2 (docs/sources.md lists those read); this is a
    /// modelling assumption: cross-die traffic shares the die-to-die interconnect with the other
    /// die's own traffic, so we charge half the stack's rate, the usual order of magnitude for
    /// chiplet interconnects relative to local HBM. Published two-die designs bracket it: AMD
    /// MI250X links its dies with 200 GB/s per direction against 1.6 TB/s of HBM per die
    /// (1/8); NVIDIA B200's 10 TB/s NV-HBI exceeds its 8 TB/s of HBM (no penalty).
    #[spec(unit = "ratio", source = "[S25] assumption (no public figure) I")]
    pub const NUMA_REMOTE_BANDWIDTH_FACTOR: f64 = 0.5;

    /// Extra latency of a DMA transfer to or from the other die's HBM: 0.5 us.
    ///
    /// Added to the fixed cost. Modelling assumption (no public figure): about a third of the documented
    /// ~1.3 us fixed cost, for the extra hops across the die boundary.
    #[spec(unit = "s", source = "[S13] assumption (no public figure) I")]
    pub const NUMA_REMOTE_EXTRA_LATENCY_S: f64 = 0.5e-6;

    // ========================================== clocks ==========================================

    /// Tensor engine (PE array) clock: 2.4 GHz.
    ///
    /// The engine table `[S1]`; the chip marketing peaks imply 2.50–2.54 GHz, which we do not use
    /// (see [`CHIP_MARKETING_BF16_TFLOPS`]). Trn1 was 2.8 GHz `[S2]`.
    #[spec(unit = "Hz", source = "[S1] D")]
    pub const PE_CLOCK_HZ: f64 = 2.4e9;

    /// Vector engine (DVE) clock: 0.96 GHz.
    #[spec(unit = "Hz", source = "[S1] D")]
    pub const VECTOR_CLOCK_HZ: f64 = 0.96e9;

    /// Scalar engine (ACT) clock: 1.2 GHz.
    #[spec(unit = "Hz", source = "[S1] D")]
    pub const SCALAR_CLOCK_HZ: f64 = 1.2e9;

    /// GpSimd engine (Pool) clock: 1.2 GHz.
    #[spec(unit = "Hz", source = "[S1] D")]
    pub const GPSIMD_CLOCK_HZ: f64 = 1.2e9;

    // =========================================== SBUF ===========================================

    /// SBUF partitions per core (the parallel P dimension).
    #[spec(unit = "count", source = "[S1][S2] D")]
    pub const SBUF_PARTITIONS: usize = 128;

    /// SBUF bytes per partition: 224 KiB.
    ///
    /// **Conflict:** 224 KiB `[S1]` vs "256 KiB per partition" `[S18]`, which is the Trainium3
    /// value (32 MiB / 128 `[S19]`). Chosen 224 KiB (= 28 MiB / 128).
    #[spec(unit = "B", source = "[S1] C")]
    pub const SBUF_PARTITION_BYTES: u64 = 224 * KIB;

    /// SBUF bytes per partition that kernels may allocate: 212,984 B (about 16 KiB reserved).
    ///
    /// The NKI tracer's target info for trn2 (trn1: 180,224 B; trn3: 245,752 B): what the
    /// compiler allocates from. trn2core's memory model (`memory`) enforces the physical
    /// [`SBUF_PARTITION_BYTES`] and quotes this value in its `CapacityError` messages.
    #[spec(unit = "B", source = "[S24] D")]
    pub const SBUF_USABLE_PARTITION_BYTES: u64 = 212_984;

    /// SBUF capacity per core: 28 MiB = 128 partitions × 224 KiB.
    #[spec(unit = "B", source = "[S1][S4] D")]
    pub const SBUF_BYTES: u64 = SBUF_PARTITIONS as u64 * SBUF_PARTITION_BYTES;

    /// SBUF capacity per chip: 224 MiB = 8 × 28 MiB.
    #[spec(unit = "B", source = "[S3] D")]
    pub const SBUF_CHIP_BYTES: u64 = CORES_PER_CHIP as u64 * SBUF_BYTES;

    // =========================================== PSUM ===========================================

    /// PSUM partitions per core.
    #[spec(unit = "count", source = "[S1][S2] D")]
    pub const PSUM_PARTITIONS: usize = 128;

    /// PSUM banks per partition (up to 8 outstanding matmul accumulation groups).
    ///
    /// 7 when bank 7 is reserved for `nc_transpose` (`NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE`) `[S33]`.
    #[spec(unit = "count", source = "[S1][S2][S23] D")]
    pub const PSUM_BANKS: usize = 8;

    /// Bytes of one PSUM bank in one partition: 2 KiB.
    #[spec(unit = "B", source = "[S1][S23] D")]
    pub const PSUM_BANK_BYTES: u64 = 2 * KIB;

    /// FP32 accumulators in one PSUM bank of one partition (bounds the moving free size).
    #[spec(unit = "elements", source = "[S2][S9] D")]
    pub const PSUM_BANK_FP32_ELEMENTS: usize = (PSUM_BANK_BYTES / 4) as usize;

    /// PSUM bytes per partition: 16 KiB = 8 banks × 2 KiB.
    #[spec(unit = "B", source = "[S1][S2] D")]
    pub const PSUM_PARTITION_BYTES: u64 = PSUM_BANKS as u64 * PSUM_BANK_BYTES;

    /// PSUM capacity per core: 2 MiB = 128 partitions × 8 banks × 2 KiB.
    #[spec(unit = "B", source = "[S1][S2][S24] D")]
    pub const PSUM_BYTES: u64 = PSUM_PARTITIONS as u64 * PSUM_PARTITION_BYTES;

    // ======================================= tensor engine ======================================

    /// Rows of the systolic PE array (the contraction dimension, one per SBUF partition).
    #[spec(unit = "count", source = "[S2][S9] D")]
    pub const PE_ROWS: usize = 128;

    /// Columns of the systolic PE array (the stationary free dimension).
    #[spec(unit = "count", source = "[S2][S9] D")]
    pub const PE_COLS: usize = 128;

    /// Largest contraction K of one `nc_matmul` (partitions of both operands).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const MATMUL_CONTRACTION_MAX: usize = PE_ROWS;

    /// Largest contraction K of one `nc_matmul` in FP8 `double_row` mode: 256 = 128 partitions × 2.
    #[spec(unit = "elements", source = "[S1][S9] D")]
    pub const MATMUL_DOUBLE_ROW_CONTRACTION_MAX: usize = 2 * PE_ROWS;

    /// Largest stationary free size M of one `nc_matmul` (the output partitions).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const MATMUL_STATIONARY_FREE_MAX: usize = PE_COLS;

    /// Largest moving free size N of one `nc_matmul`: one PSUM bank of FP32 (more only from v4).
    #[spec(unit = "elements", source = "[S2][S9] D")]
    pub const MATMUL_MOVING_FREE_MAX: usize = PSUM_BANK_FP32_ELEMENTS;

    /// Full-array PE tile: 128 rows (the default `tile_size`).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const PE_TILE_FULL: usize = PE_ROWS;

    /// Half-array PE row tile: 2 × 64 (NCv2 and later).
    #[spec(unit = "elements", source = "[S9][S10] D")]
    pub const PE_TILE_HALF: usize = PE_ROWS / 2;

    /// Quarter-array PE row tile: 4 × 32 (new in NCv3).
    ///
    /// Column tiling is a **conflict** in `[S9]` (described in the body, but the parameters say
    /// `column_size must be 128`); the same sizes are listed for columns in
    /// [`PE_ROW_TILE_SIZES`] and the engine decides whether to accept them.
    #[spec(unit = "elements", source = "[S9][S10] D")]
    pub const PE_TILE_QUARTER: usize = PE_ROWS / 4;

    /// Minimum initiation interval of a MultiplyMoving instruction (MM_INIT_LATENCY): 64 PE cycles.
    ///
    /// The `nc_matmul` cost is `max(min(64, M), N)` PE cycles `[S10]`. Documented for NCv2; applied
    /// to NCv3 at 2.4 GHz (inferred, no v3 table published).
    #[spec(unit = "cycles", source = "[S2][S10] D")]
    pub const MM_INIT_LATENCY_CYCLES: usize = 64;

    /// Cost multiplier of an FP32 (non-TF32) `nc_matmul`: 4× the cycles of BF16.
    #[spec(unit = "ratio", source = "[S2][S10] D")]
    pub const MATMUL_FP32_COST_FACTOR: usize = 4;

    /// Throughput factor of FP8 `double_row` mode over BF16: a 256 contraction in the same cycles.
    #[spec(unit = "ratio", source = "[S1][S9] D")]
    pub const DOUBLE_ROW_THROUGHPUT_FACTOR: usize = 2;

    /// Maximum speed-up of a "fast" LoadStationary over a MultiplyMoving of the same free size.
    #[spec(unit = "ratio", source = "[S2] D")]
    pub const FAST_LOAD_STATIONARY_SPEEDUP: usize = 4;

    /// FLOPs counted per multiply-accumulate.
    #[spec(unit = "FLOP", source = "[S1][S4] I")]
    pub const FLOPS_PER_MAC: usize = 2;

    /// Per-core dense BF16/FP16/TF32 peak: 128 × 128 × 2 × 2.4 GHz ≈ 78.6 TFLOPS.
    ///
    /// Also the rate of FP8 without `double_row` and of FP8_E3 (which runs at BF16 speed).
    /// Computed from the clock; the documented "79 TFLOPS" is this value rounded
    /// ([`CORE_DOCUMENTED_BF16_TFLOPS`]).
    #[spec(unit = "FLOP/s", source = "[S1] I")]
    pub const CORE_PEAK_BF16_FLOPS_PER_S: f64 =
        (PE_ROWS * PE_COLS * FLOPS_PER_MAC) as f64 * PE_CLOCK_HZ;

    /// Per-core dense FP8 `double_row` peak: 2 × the BF16 peak ≈ 157.3 TFLOPS (documented "158").
    #[spec(unit = "FLOP/s", source = "[S1] I")]
    pub const CORE_PEAK_FP8_DOUBLE_ROW_FLOPS_PER_S: f64 =
        CORE_PEAK_BF16_FLOPS_PER_S * DOUBLE_ROW_THROUGHPUT_FACTOR as f64;

    /// Per-core dense FP32 peak: the BF16 peak / 4 ≈ 19.7 TFLOPS (documented "20").
    #[spec(unit = "FLOP/s", source = "[S1] I")]
    pub const CORE_PEAK_FP32_FLOPS_PER_S: f64 =
        CORE_PEAK_BF16_FLOPS_PER_S / MATMUL_FP32_COST_FACTOR as f64;

    /// Per-core structured-sparse peak: 4 × the BF16 peak ≈ 314.6 TFLOPS (documented "316").
    #[spec(unit = "FLOP/s", source = "[S1][S4] I")]
    pub const CORE_PEAK_SPARSE_FLOPS_PER_S: f64 =
        CORE_PEAK_BF16_FLOPS_PER_S * SPARSE_MAX_THROUGHPUT_FACTOR as f64;

    /// Documented per-core dense BF16/FP16/TF32 peak (rounded; reports only).
    #[spec(unit = "TFLOPS", source = "[S1][S4] D")]
    pub const CORE_DOCUMENTED_BF16_TFLOPS: f64 = 79.0;

    /// Documented per-core dense FP8 peak (rounded; reports only).
    #[spec(unit = "TFLOPS", source = "[S1][S4] D")]
    pub const CORE_DOCUMENTED_FP8_TFLOPS: f64 = 158.0;

    /// Documented per-core dense FP32 peak (rounded; reports only).
    #[spec(unit = "TFLOPS", source = "[S1][S4] D")]
    pub const CORE_DOCUMENTED_FP32_TFLOPS: f64 = 20.0;

    /// Documented per-core structured-sparse peak (= 4 × 79; reports only).
    #[spec(unit = "TFLOPS", source = "[S1][S4] D")]
    pub const CORE_DOCUMENTED_SPARSE_TFLOPS: f64 = 316.0;

    /// Chip marketing dense FP8 peak (launch docs: 1,287); not 8 × the per-core peak, reports only.
    ///
    /// **Conflict:** 1,299 `[S3 current]` vs 1,287 `[S27]`; 8 × 157.3 = 1,258. The model uses the
    /// clock-derived peaks; this is kept for comparison tables.
    #[spec(unit = "TFLOPS", source = "[S3][S27] C")]
    pub const CHIP_MARKETING_FP8_TFLOPS: f64 = 1299.0;

    /// Chip marketing dense BF16/FP16/TF32 peak (launch docs: 655); reports only.
    ///
    /// **Conflict:** 667 `[S3]` vs 655 `[S27]`; 8 × 78.6 = 629. 667 would need a 2.54 GHz clock.
    #[spec(unit = "TFLOPS", source = "[S3][S27] C")]
    pub const CHIP_MARKETING_BF16_TFLOPS: f64 = 667.0;

    /// Chip marketing structured-sparse peak (launch docs: 2,551); reports only.
    ///
    /// **Conflict:** 2,563 `[S3 current]` vs 2,551 `[S27]`. Chosen 2,563: the current chip page,
    /// as for the dense peaks above.
    #[spec(unit = "TFLOPS", source = "[S3][S27] C")]
    pub const CHIP_MARKETING_SPARSE_TFLOPS: f64 = 2563.0;

    /// Chip marketing dense FP32 peak; reports only.
    ///
    /// **Conflict:** 181 `[S3][S27]` vs 8 × 19.7 = 157 from the clock (15 % apart, the largest
    /// gap of the four marketing figures).
    #[spec(unit = "TFLOPS", source = "[S3][S27] C")]
    pub const CHIP_MARKETING_FP32_TFLOPS: f64 = 181.0;

    // ==================================== structured sparsity ===================================

    /// Largest sparse-over-dense throughput factor of the tensor engine (never above 316 TFLOPS).
    #[spec(unit = "ratio", source = "[S1][S4] D")]
    pub const SPARSE_MAX_THROUGHPUT_FACTOR: usize = 4;

    /// Largest group size M of an N:M sparsity pattern (4:16).
    ///
    /// From the commented-out NKI text ("max N = 16" in its notation) `[S1]`; the seven patterns
    /// are [`SPARSITY_PATTERNS`].
    #[spec(unit = "elements", source = "[S1][S4] D")]
    pub const SPARSE_MAX_GROUP_ELEMENTS: usize = 16;

    /// Bits of one packed position in the sparse tag tensor (a position within a group of 16).
    ///
    /// Provisional: from the unreleased NKI sparse API text (128 × 32 uint16 tag, four 4-bit
    /// positions each) `[S1]`.
    #[spec(unit = "bit", source = "[S1] I")]
    pub const SPARSE_POSITION_BITS: usize = 4;

    // ==================================== dI/dt throttling ======================================

    /// Fraction of peak tensor-engine utilisation allowed when work starts (dI/dt limit).
    #[spec(unit = "fraction", source = "[S18] D")]
    pub const THROTTLE_START_FRACTION: f64 = 0.5;

    /// Time for the dI/dt limit to ramp from the start fraction to full utilisation: about 3 µs.
    #[spec(unit = "s", source = "[S18] D")]
    pub const THROTTLE_RAMP_S: f64 = 3e-6;

    /// Window over which low utilisation re-engages the limit: about 3 µs.
    #[spec(unit = "s", source = "[S18] D")]
    pub const THROTTLE_REENGAGE_WINDOW_S: f64 = 3e-6;

    /// Utilisation below which (over the window) the limit re-engages.
    #[spec(unit = "fraction", source = "[S18] D")]
    pub const THROTTLE_REENGAGE_UTILIZATION: f64 = 0.5;

    // ============================ vector / scalar / gpsimd engines ==============================

    /// Vector engine elements per cycle for BF16/FP16 in performance mode.
    #[spec(unit = "elements/cycle", source = "[S1] D")]
    pub const VECTOR_ELEMENTS_PER_CYCLE_16BIT: usize = 512;

    /// Vector engine elements per cycle for other dtypes (and 16-bit ops with a PSUM side).
    #[spec(unit = "elements/cycle", source = "[S1] D")]
    pub const VECTOR_ELEMENTS_PER_CYCLE: usize = 256;

    /// Scalar engine elements per cycle (one per partition).
    #[spec(unit = "elements/cycle", source = "[S1] D")]
    pub const SCALAR_ELEMENTS_PER_CYCLE: usize = 128;

    /// Documented Vector engine FP32 peak (the FLOP-counting convention is undocumented).
    #[spec(unit = "FLOP/s", source = "[S1][S4] D")]
    pub const VECTOR_PEAK_FP32_FLOPS_PER_S: f64 = 1.0e12;

    /// Documented Scalar engine FP32 peak.
    #[spec(unit = "FLOP/s", source = "[S4] D")]
    pub const SCALAR_PEAK_FP32_FLOPS_PER_S: f64 = 1.2e12;

    /// Minimum initiation interval of Vector/Scalar/GpSimd instructions (MIN_II), in engine cycles.
    #[spec(unit = "cycles", source = "[S10] D")]
    pub const MIN_II_CYCLES: usize = 64;

    /// Minimum initiation interval of dynamic-address copies (MIN_II_DYNAMIC), in engine cycles.
    #[spec(unit = "cycles", source = "[S10] D")]
    pub const MIN_II_DYNAMIC_CYCLES: usize = 600;

    /// Fixed overhead of a Vector engine instruction (NKI-library heuristic).
    #[spec(unit = "cycles", source = "[S23] D")]
    pub const DVE_FIXED_OVERHEAD_CYCLES: usize = 144;

    /// Static overhead added to back-to-back dependent Vector/Scalar instructions (NCv2 text).
    #[spec(unit = "cycles", source = "[S2] D")]
    pub const DEPENDENT_INSTRUCTION_OVERHEAD_CYCLES: usize = 100;

    /// Static overhead to initiate an SBUF/PSUM tensor access (NCv2 text).
    #[spec(unit = "cycles", source = "[S2] D")]
    pub const TENSOR_ACCESS_INIT_CYCLES: usize = 60;

    /// GpSimd instruction start-up overhead (GPSIMD_START).
    #[spec(unit = "cycles", source = "[S10] D")]
    pub const GPSIMD_START_CYCLES: usize = 150;

    /// Programmable processors in the GpSimd engine (each wired to 16 partitions).
    #[spec(unit = "count", source = "[S2] D")]
    pub const GPSIMD_PROCESSORS: usize = 8;

    /// Total bandwidth of the 8 GpSimd-integrated DMA engines (both directions): 307 GB/s.
    ///
    /// Used by `sendrecv` between the two cores of an LNC=2 pair.
    #[spec(unit = "B/s", source = "[S1] D")]
    pub const GPSIMD_DMA_BYTES_PER_S: f64 = 307e9;

    /// GpSimd-integrated DMA bandwidth per direction: 153 GB/s.
    #[spec(unit = "B/s", source = "[S1] D")]
    pub const GPSIMD_DMA_BYTES_PER_S_PER_DIRECTION: f64 = 153e9;

    // ============================== whole-core machine (issue 14) ===============================

    /// Partitions of an SBUF/PSUM quadrant (the unit of an engine access's start partition).
    ///
    /// The rule: more than 64 partitions start at 0, 33 to 64 at 0 or 64, up to 32 at a multiple of 32.
    #[spec(unit = "count", source = "[S2] D")]
    pub const SBUF_QUADRANT_PARTITIONS: usize = 32;

    /// Largest free size of one `bn_stats` input (`nl.tile_size.bn_stats_fmax`).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const BN_STATS_FMAX: usize = 512;

    /// Fewest elements per partition `max8` and `nc_find_index8` read (NKI ISA reference).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const MAX8_MIN_ELEMENTS: usize = 8;

    /// Most elements per partition `max8` and `nc_find_index8` read (NKI ISA reference).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const MAX8_MAX_ELEMENTS: usize = 16384;

    /// Largest side of a Vector-engine `nc_transpose` (32 x 32; the tensor engine's is 128).
    #[spec(unit = "elements", source = "[S9] D")]
    pub const VECTOR_TRANSPOSE_MAX: usize = 32;

    /// Vector cycles per element of its two-input instructions.
    ///
    /// The `2N` of tensor_tensor,
    /// tensor_tensor_scan, scalar_tensor_tensor, select; one-input ones take `N`).
    #[spec(unit = "cycles/element", source = "[S2][S10] D")]
    pub const DVE_TWO_INPUT_CYCLES_PER_ELEMENT: usize = 2;

    /// Vector cycles per element of `reciprocal` (`max(MIN_II, 8N)`; ACT's is `N`).
    #[spec(unit = "cycles/element", source = "[S10][S11] D")]
    pub const DVE_RECIPROCAL_CYCLES_PER_ELEMENT: usize = 8;

    /// Vector cycles per `(count, mean, m2)` triple of `bn_aggr` (`max(MIN_II, 13 * (N / 3))`).
    #[spec(unit = "cycles/triple", source = "[S10] D")]
    pub const DVE_BN_AGGR_CYCLES_PER_TRIPLE: usize = 13;

    /// Vector "performance mode" speed-up of the fastest class (contiguous 16-bit copies).
    ///
    /// For tensor_copy / tensor_scalar with bf16/fp16 in and
    /// out of SBUF and a contiguous innermost dimension (Trn2 over NCv2).
    ///
    /// Documented as a throughput factor; trn2core divides the NCv2 cycle formula by it (that
    /// application is inferred).
    #[spec(unit = "ratio", source = "[S1] D; applied I")]
    pub const DVE_PERF_MODE_FAST: usize = 4;

    /// Vector "performance mode" speed-up of the second class (strided or PSUM 16-bit).
    ///
    /// For the same instructions with a strided innermost
    /// dimension or one side in PSUM, and for tensor_tensor with all-bf16/fp16 tiles in SBUF.
    #[spec(unit = "ratio", source = "[S1] D; applied I")]
    pub const DVE_PERF_MODE: usize = 2;

    /// GpSimd cycles per element of its element-wise instructions.
    ///
    /// Applies to tensor_tensor, tensor_copy,
    /// memset, tensor_scalar), after the start-up overhead.
    ///
    /// Inferred: eight 512-bit processors, each serving 16 partitions with 16 fp32 lanes, stream
    /// one element per partition per cycle; no per-instruction formula is published.
    #[spec(unit = "cycles/element", source = "[S2] I")]
    pub const GPSIMD_CYCLES_PER_ELEMENT: usize = 1;

    /// GpSimd cycles per element of `tensor_scalar(op0=rsqrt)`.
    ///
    /// "4x lower throughput" than the
    /// Scalar engine's one element per cycle.
    #[spec(unit = "cycles/element", source = "[S11] D")]
    pub const GPSIMD_RSQRT_CYCLES_PER_ELEMENT: usize = 4;

    /// Scalar cycles to read its accumulation registers out to a tile.
    ///
    /// `ActReadAccumulator` on NCv2: the extra `MIN_II` of `activation_reduce`.
    #[spec(unit = "cycles", source = "[S2][S10] D")]
    pub const ACT_READ_ACCUMULATOR_CYCLES: usize = 64;

    // =========================================== DMA ============================================

    /// DMA engines per physical core.
    #[spec(unit = "count", source = "[S1][S12][S25] D")]
    pub const DMA_ENGINES_PER_CORE: usize = 16;

    /// DMA queues per DMA engine (IDs 0–15; a transfer uses one queue ID on all 16 engines).
    #[spec(unit = "count", source = "[S12][S25] D")]
    pub const DMA_QUEUES_PER_ENGINE: usize = 16;

    /// Source tensors of one `dma_compute` at most.
    ///
    /// The NKI ISA reference: "The max number of source tensors in `srcs` is 16".
    #[spec(unit = "count", source = "[S9] D")]
    pub const DMA_COMPUTE_MAX_SOURCES: usize = 16;

    /// DMA engines per chip for core data movement: 128 = 8 × 16.
    #[spec(unit = "count", source = "[S1] D")]
    pub const DMA_ENGINES_PER_CHIP: usize = CORES_PER_CHIP * DMA_ENGINES_PER_CORE;

    /// Additional host (H2D/D2H) DMA engines per chip (132 in total with the core engines).
    #[spec(unit = "count", source = "[S25] D")]
    pub const DMA_HOST_ENGINES_PER_CHIP: usize = 4;

    /// Partitions one DMA engine typically serves when all 16 engines move a 128-partition tile.
    #[spec(unit = "count", source = "[S2][S12] D")]
    pub const DMA_PARTITIONS_PER_ENGINE: usize = SBUF_PARTITIONS / DMA_ENGINES_PER_CORE;

    /// Effective bandwidth of one DMA engine: 23 B/ns = 23 GB/s (the timing model's rate).
    ///
    /// **Conflict:** 23 B/ns in the Trn2 tables `[S12][S13]` vs "theoretical bandwidth of
    /// 27.2 GB/s" in the text `[S12]`. Chosen 23 B/ns: the tables are Trn2-specific and a measured
    /// 32 KiB transfer ran at 23.1 B/ns ([`DMA_MEASURED_EXAMPLE_BYTES`]). The theoretical value
    /// is [`DMA_ENGINE_THEORETICAL_BYTES_PER_S`].
    #[spec(unit = "B/s", source = "[S12][S13] C")]
    pub const DMA_ENGINE_BYTES_PER_S: f64 = 23e9;

    /// Theoretical bandwidth of one DMA engine: 27.2 GB/s (128 × 27.2 ≈ the chip's 3.5 TB/s).
    ///
    /// **Conflict:** 27.2 GB/s theoretical in the text `[S12]` vs 23 B/ns in its Trn2 tables;
    /// this is the theoretical one, kept for the chip-level check; the timing model uses
    /// [`DMA_ENGINE_BYTES_PER_S`].
    #[spec(unit = "B/s", source = "[S12] C")]
    pub const DMA_ENGINE_THEORETICAL_BYTES_PER_S: f64 = 27.2e9;

    /// Effective DMA bandwidth of one core: 16 × 23 B/ns = 368 GB/s.
    #[spec(unit = "B/s", source = "[S12][S13] D")]
    pub const DMA_CORE_BYTES_PER_S: f64 = DMA_ENGINES_PER_CORE as f64 * DMA_ENGINE_BYTES_PER_S;

    /// DMA bandwidth per chip: 3.5 TB/s ("with inline memory compression and decompression").
    #[spec(unit = "B/s", source = "[S3] D")]
    pub const DMA_CHIP_BYTES_PER_S: f64 = 3.5e12;

    /// Documented fixed cost per DMA transfer (descriptor setup, synchronisation, semaphore-to-start): about 1.3 µs.
    ///
    /// Kept for reference: the model uses the calibrated [`DMA_FIXED_COST_S`] and
    /// [`DMA_HBM_READ_LATENCY_S`], which Trn2's published profiles put lower.
    #[spec(unit = "s", source = "[S13] D")]
    pub const DMA_DOCUMENTED_FIXED_COST_S: f64 = 1300e-9;

    /// Fixed cost of a DMA transfer that does not read HBM (descriptors, semaphore-to-start, completion).
    ///
    /// Fitted on the trigger-to-completion times of the two stores (SBUF to HBM) profiled on a
    /// Trn2 NeuronCore-v3 in "Introduction to DMA with NKI" (points `dma-ex1-store`,
    /// `dma-ex2-store`: 2.13 and 0.86 us, of which the engines' data movement is 1.43 and 0.10
    /// us). The documented "~1300 ns cross-engine" ([`DMA_DOCUMENTED_FIXED_COST_S`]) is above
    /// every published Trn2 transfer.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const DMA_FIXED_COST_S: f64 = 0.75e-6;

    /// Extra fixed cost of a DMA transfer that reads HBM: the read's round trip before data flows.
    ///
    /// Fitted on the two loads (HBM to SBUF) of the same page (points `dma-ex1-load`,
    /// `dma-ex2-load`: 2.43 and 1.21 us), against the stores' [`DMA_FIXED_COST_S`]: a load
    /// waits for HBM to return data, a store's writes are posted.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const DMA_HBM_READ_LATENCY_S: f64 = 0.34e-6;

    /// Engine time per partition row of a DMA transfer besides its bytes (one descriptor element).
    ///
    /// The size efficiency of a transfer with `s` bytes per partition row is
    /// `s / (s + DMA_ENGINE_BYTES_PER_S x this)`. Fitted on the two engine-operation durations of
    /// "Introduction to DMA with NKI" (points `dma-ex1-engine`: 4 rows of 8 KiB in 1416 ns,
    /// `dma-ex2-engine`: 8 rows of 256 B in 97 ns): 256-byte rows still run at 21 B/ns, so the
    /// per-row overhead is about one nanosecond (23 B at 23 B/ns). The documented advice (under
    /// 256 B per partition overhead-bound, full rate from 4 KiB) describes whole transfers,
    /// whose fixed cost dominates small ones.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const DMA_ROW_OVERHEAD_S: f64 = 1.0e-9;

    /// Cost of one hardware-DGE DMA instruction: about 600 ns.
    #[spec(unit = "s", source = "[S1][S14] D")]
    pub const HWDGE_INSTRUCTION_S: f64 = 600e-9;

    /// Hardware descriptor-generation (HWDGE) blocks per core (triggered by Sync or Scalar).
    #[spec(unit = "count", source = "[S14] D")]
    pub const HWDGE_PER_CORE: usize = 2;

    /// Bytes per partition from which a DMA transfer runs at full rate: 4 KiB.
    #[spec(unit = "B", source = "[S12][S13] D")]
    pub const DMA_FULL_RATE_PARTITION_BYTES: u64 = 4 * KIB;

    /// Recommended minimum bytes per partition of a DMA transfer: 2 KiB.
    #[spec(unit = "B", source = "[S12][S13] D")]
    pub const DMA_RECOMMENDED_PARTITION_BYTES: u64 = 2 * KIB;

    /// Bytes per partition below which a DMA transfer is severely overhead-bound: 256 B.
    #[spec(unit = "B", source = "[S12][S13] D")]
    pub const DMA_OVERHEAD_BOUND_PARTITION_BYTES: u64 = 256;

    /// Size of the measured single-engine HBM→SBUF transfer used to calibrate the DMA rate.
    #[spec(unit = "B", source = "[S12] D")]
    pub const DMA_MEASURED_EXAMPLE_BYTES: u64 = 32 * KIB;

    /// Duration of the measured 32 KiB single-engine transfer: 1,416 ns (≈ 23.1 B/ns).
    #[spec(unit = "s", source = "[S12] D")]
    pub const DMA_MEASURED_EXAMPLE_S: f64 = 1416e-9;

    /// Upper bound of DMA-transpose throughput HBM→SBUF, as a fraction of plain DMA copy.
    #[spec(unit = "fraction", source = "[S1][S14] D")]
    pub const DMA_TRANSPOSE_HBM_TO_SBUF_EFFICIENCY: f64 = 0.9;

    /// Upper bound of DMA-transpose throughput SBUF→SBUF, as a fraction of plain DMA copy.
    #[spec(unit = "fraction", source = "[S1][S14] D")]
    pub const DMA_TRANSPOSE_SBUF_TO_SBUF_EFFICIENCY: f64 = 0.5;

    /// Throughput of accumulate-type (reducing) DMA transfers relative to a copy, before NCv4.
    #[spec(unit = "fraction", source = "[S19] D")]
    pub const DMA_ACCUMULATE_EFFICIENCY: f64 = 0.5;

    // ============================== logical cores, instances, torus =============================

    /// Default Logical NeuronCore size on Trn2 (LNC=2: two adjacent cores sharing an HBM stack).
    #[spec(unit = "count", source = "[S6] D")]
    pub const LNC_DEFAULT: usize = 2;

    /// Largest LNC documented by AWS for Trn2 (documented values are 1 and 2).
    #[spec(unit = "count", source = "[S6][S34] D")]
    pub const LNC_MAX_DOCUMENTED: usize = 2;

    /// Largest LNC trn2core accepts: 4 (a product extension of 4 adjacent cores, one die).
    ///
    /// Not in AWS documentation; the product description allows "two or four adjacent physical
    /// NeuronCores" `[P]`. The allowed values are [`LNC_ALLOWED`].
    #[spec(unit = "count", source = "[P] I")]
    pub const LNC_MAX: usize = 4;

    /// Chips in a trn2.3xlarge instance.
    #[spec(unit = "count", source = "[P] D")]
    pub const CHIPS_PER_TRN2_3XLARGE: usize = 1;

    /// Chips in a trn2.48xlarge or trn2u.48xlarge instance: 16, a 4 × 4 2-D torus.
    #[spec(unit = "count", source = "[S5][S15] D")]
    pub const CHIPS_PER_INSTANCE: usize = INSTANCE_TORUS_X * INSTANCE_TORUS_Y;

    /// Torus extent along X within an instance.
    #[spec(unit = "count", source = "[S5][S15] D")]
    pub const INSTANCE_TORUS_X: usize = 4;

    /// Torus extent along Y within an instance.
    #[spec(unit = "count", source = "[S5][S15] D")]
    pub const INSTANCE_TORUS_Y: usize = 4;

    /// trn2u.48xlarge instances in one Trn2 UltraServer (the Z ring of the 4 × 4 × 4 torus).
    #[spec(unit = "count", source = "[S5][S15] D")]
    pub const ULTRASERVER_INSTANCES: usize = 4;

    /// Torus extent along Z in an UltraServer (chips with the same (x, y) form a ring).
    #[spec(unit = "count", source = "[S15][S28] D")]
    pub const ULTRASERVER_TORUS_Z: usize = ULTRASERVER_INSTANCES;

    /// Chips in a Trn2 UltraServer: 64 (4 × 4 × 4 torus).
    #[spec(unit = "count", source = "[S3][S5] D")]
    pub const CHIPS_PER_ULTRASERVER: usize = CHIPS_PER_INSTANCE * ULTRASERVER_INSTANCES;

    /// Non-overlapping Hamiltonian cycles used by Ring/KangaRing on the 16-chip 2-D torus.
    #[spec(unit = "count", source = "[S16] D")]
    pub const TORUS_HAMILTONIAN_CYCLES: usize = 2;

    // ========================================= NeuronLink =======================================

    /// NeuronLink-v3 links per chip within an instance (X and Y torus neighbours).
    #[spec(unit = "count", source = "[S1][S5] D")]
    pub const NEURONLINK_XY_LINKS_PER_CHIP: usize = 4;

    /// Additional NeuronLink-v3 links per chip in an UltraServer (Z torus neighbours).
    #[spec(unit = "count", source = "[S15][P] D")]
    pub const NEURONLINK_Z_LINKS_PER_CHIP: usize = 2;

    /// Directions per NeuronLink (full duplex: each direction carries the per-direction rate).
    #[spec(unit = "count", source = "[S3][S5][P] I")]
    pub const NEURONLINK_DIRECTIONS: usize = 2;

    /// Bandwidth of one X or Y NeuronLink, per direction: 128 GB/s.
    ///
    /// From the product description `[P]` ("128 GB/s per connection"). An equal split of the
    /// documented total, 256 GB/s per link (direction convention unknown), is not used: with
    /// 2 directions, 4 × 128 × 2 = 1024 GB/s matches the documented intra-instance figure `[S5]`.
    #[spec(unit = "B/s", source = "[P] D; sum [S5] D")]
    pub const NEURONLINK_XY_LINK_BYTES_PER_S: f64 = 128e9;

    /// Bandwidth of one Z NeuronLink (between instances of an UltraServer), per direction: 64 GB/s.
    ///
    /// From the product description `[P]` (OSFP-XD cables), not the equal split's 128 GB/s; with 2
    /// directions, 2 × 64 × 2 = 256 GB/s matches the documented inter-instance figure `[S5]`.
    #[spec(unit = "B/s", source = "[P] D; sum [S5] D")]
    pub const NEURONLINK_Z_LINK_BYTES_PER_S: f64 = 64e9;

    /// NeuronLink bandwidth per chip within an instance, all links and directions: 1024 GB/s.
    #[spec(unit = "B/s", source = "[S5] D")]
    pub const NEURONLINK_INTRA_INSTANCE_BYTES_PER_S: f64 = 1024e9;

    /// NeuronLink bandwidth per chip between instances of an UltraServer: 256 GB/s.
    #[spec(unit = "B/s", source = "[S5] D")]
    pub const NEURONLINK_INTER_INSTANCE_BYTES_PER_S: f64 = 256e9;

    /// Total NeuronLink-v3 bandwidth per chip: 1.28 TB/s (Trn1: 384 GB/s).
    #[spec(unit = "B/s", source = "[S3] D")]
    pub const NEURONLINK_CHIP_BYTES_PER_S: f64 = 1.28e12;

    // ================================== EFA and collectives =====================================

    /// EFA network bandwidth per chip: 200 Gbps (50 Gbps per LNC=2 rank).
    #[spec(unit = "bit/s", source = "[S15] D")]
    pub const EFA_CHIP_BITS_PER_S: f64 = 200e9;

    /// EFA bandwidth per chip in bytes: 25 GB/s.
    #[spec(unit = "B/s", source = "[S15] I")]
    pub const EFA_CHIP_BYTES_PER_S: f64 = EFA_CHIP_BITS_PER_S / 8.0;

    /// EFA (v3) network bandwidth per trn2.48xlarge instance: 3.2 Tbps.
    #[spec(unit = "bit/s", source = "[S5][S15] D")]
    pub const EFA_INSTANCE_BITS_PER_S: f64 = 3200e9;

    /// Minimal inter-server RDMA write latency, HBM to HBM: about 15 µs.
    #[spec(unit = "s", source = "[S15] D")]
    pub const EFA_LATENCY_S: f64 = 15e-6;

    /// Per-hop latency of Ring/KangaRing collectives used by the model: 1.5 µs.
    ///
    /// Documented as "about 1-2 us (HBM load dependent)" `[S16]`; the midpoint is our choice.
    #[spec(unit = "s", source = "[S16] I")]
    pub const RING_HOP_LATENCY_S: f64 = 1.5e-6;

    /// Lower end of the documented Ring/KangaRing per-hop latency.
    #[spec(unit = "s", source = "[S16] D")]
    pub const RING_HOP_LATENCY_MIN_S: f64 = 1e-6;

    /// Upper end of the documented Ring/KangaRing per-hop latency.
    #[spec(unit = "s", source = "[S16] D")]
    pub const RING_HOP_LATENCY_MAX_S: f64 = 2e-6;

    /// Message size below which the Mesh algorithm is chosen: 1 MB.
    ///
    /// Decimal megabytes: the same page computes "1MB at 100GBps takes 10 us". RDH is used from
    /// here up to [`COLLECTIVE_RDH_MAX_BYTES`], KangaRing above ("sweet range, empirically").
    #[spec(unit = "B", source = "[S16] D")]
    pub const COLLECTIVE_MESH_MAX_BYTES: u64 = 1_000_000;

    /// Message size up to which the RDH algorithm is chosen (KangaRing above): 56 MB.
    #[spec(unit = "B", source = "[S16] D")]
    pub const COLLECTIVE_RDH_MAX_BYTES: u64 = 56_000_000;

    /// Ranks of the 4 x 4 instance the documented Mesh/RDH/KangaRing message ranges describe: 64.
    ///
    /// The runtime's page describes the ranges on a trn2.48xlarge at LNC=2 ("4 groups of 16
    /// ranks", "the other 60 off-chip ranks"): 16 chips x 4 ranks. The model applies the ranges
    /// to the chunk each rank owns (message / ranks), so a 16-rank group switches at a quarter
    /// of the sizes: the published 16-rank run used KangaRing at 32 MiB (`allr-r16-32MiB`).
    #[spec(unit = "count", source = "[S16] I")]
    pub const COLLECTIVE_RANGES_RANKS: usize = 64;

    /// All-reduce message size up to which Mesh runs as a single step (each rank broadcasts its whole buffer, receivers reduce).
    ///
    /// The runtime documents the single-step Mesh all-reduce (fewer steps, more traffic) without
    /// its threshold. The published 16-rank run brackets it (points `allr-r16-8KiB`, 300 us, and
    /// `allr-r16-128KiB`, 574 us: one more step); 32 KiB, the middle on a log scale, is a guess.
    #[spec(unit = "B", source = "[S16] D; [F] calibrated")]
    pub const COLLECTIVE_SINGLE_STEP_MESH_MAX_BYTES: u64 = 32 * KIB;

    /// The runtime's fixed cost of one collective operation that does not reduce (launch, handshakes, completion).
    ///
    /// Fitted on the all-gathers of the nccom-test guide (points `allg-r8-*`, `allg-r32-*`,
    /// `allgv-r4-2KiB`: floors of 6-16 us, medium confidence) with the other collective terms.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const COLLECTIVE_OP_FIXED_S: f64 = 6.5e-6;

    /// The runtime's fixed cost of one all-reduce or reduce-scatter operation.
    ///
    /// Fitted on the 16-rank all-reduce of the nccom-test guide (points `allr-r16-*`): 300 us
    /// for any size up to 8 KiB, where the model's transfers take under 10 us. No documented
    /// mechanism explains it; the all-gathers of the same guide have floors of 6-16 us.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const COLLECTIVE_REDUCE_OP_FIXED_S: f64 = 291e-6;

    /// The runtime's fixed cost of each synchronised reducing step of a collective (a step whose receivers reduce before the next step sends on).
    ///
    /// Fitted on the 16-rank all-reduce (points `allr-r16-128KiB`, `allr-r16-2MiB`,
    /// `allr-r16-32MiB`, `allr-r16-512MiB`): the two-step Mesh adds 274 us to the single-step
    /// one, RDH has two reducing steps, KangaRing seven (a cycle of 8 primary ranks on 4 chips).
    /// Copying steps show no such cost (the all-gathers fit with none).
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const COLLECTIVE_REDUCE_STEP_S: f64 = 234e-6;

    /// Fraction of a NeuronLink's bandwidth per direction that collectives achieve.
    ///
    /// Fitted on the large all-reduces of the 16-rank run (points `allr-r16-32MiB`,
    /// `allr-r16-512MiB`: 104 GB/s of bus bandwidth at 512 MiB over a row of four chips whose
    /// links carry 256 GB/s each way) and the all-gathers' largest sizes.
    #[spec(unit = "fraction", source = "[F] calibrated")]
    pub const NEURONLINK_ACHIEVED_FRACTION: f64 = 0.40;

    /// Fraction of the nominal EFA bandwidth per chip that HBM-to-HBM RDMA achieves when every chip of an instance sends at once: 0.675.
    ///
    /// Measured on a trn2.48xlarge with a transfer engine writing Neuron HBM directly over EFA
    /// `[S36]`: one chip sustains 19.3 GB/s (0.77 of its 25 GB/s), all 16 together about
    /// 270 GB/s, 16.9 GB/s each (0.675). A collective drives every chip's NICs at once, so the
    /// all-chips figure is the one used. Neither a fit nor a Neuron collective measurement: the
    /// runtime's own EFA path may do better or worse.
    #[spec(unit = "fraction", source = "[S36] I")]
    pub const EFA_ACHIEVED_FRACTION: f64 = 270e9 / (CHIPS_PER_INSTANCE as f64 * EFA_CHIP_BYTES_PER_S);

    /// The fixed cost of one all-reduce or reduce-scatter launched inside a compiled graph (a model's NEFF), not by itself.
    ///
    /// A standalone `nccom-test` all-reduce pays [`COLLECTIVE_REDUCE_OP_FIXED_S`] (291 us); the
    /// DeepSeek-V3 decode profile of neuronx-distributed-inference's contrib README (TP=64,
    /// LNC=2, trn2.48xlarge, `[S37]`) puts its ~122 all-reduces at ~3 ms, about 25 us each
    /// including their transfers (the model's transfers, within-chip stage and DMA fixed cost
    /// take ~13 us of each, so the fixed cost is ~11 us). Fitted on that point alone (`dsv3-tp64-decode-collectives`
    /// in benches/fidelity/published.toml); the whole-model tutorial baselines are not fitted.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const COLLECTIVE_IN_GRAPH_REDUCE_OP_FIXED_S: f64 = 11.2e-6;

    /// The fixed cost of each synchronised reducing step of a collective inside a compiled graph.
    ///
    /// No published point isolates it (the decode all-reduces are single-step Mesh). Taken as
    /// the standalone step cost scaled by the same in-graph ratio as the operation's fixed cost
    /// (234 us x 11.2 / 291 = 9 us): a guess, which the long prefills' reduce-scatters
    /// (31 KangaRing steps at 64 ranks) depend on.
    #[spec(unit = "s", source = "[F] I")]
    pub const COLLECTIVE_IN_GRAPH_REDUCE_STEP_S: f64 = COLLECTIVE_REDUCE_STEP_S
        * (COLLECTIVE_IN_GRAPH_REDUCE_OP_FIXED_S / COLLECTIVE_REDUCE_OP_FIXED_S);

    /// The fixed cost of one dependent operation (kernel) of a compiled model step besides its own modelled time.
    ///
    /// Each op of a step (a norm, a projection, the attention kernel, an expert GEMM) starts
    /// after the one before it has written its output: its DMA round trips, semaphore waits
    /// and the slowest of the ranks at the next barrier (the DeepSeek-V3 profile `[S37]`
    /// reports the straggler wait separately, ~1 ms of ~19). Fitted on the DeepSeek-V3 decode
    /// step (`dsv3-tp64-tpot`: 20.5 ms at TP=64, bs=1), given the model's GEMMs, KV reads and
    /// in-graph collectives; the tutorial baselines are not fitted.
    #[spec(unit = "s", source = "[F] calibrated")]
    pub const WORKLOAD_OP_FIXED_S: f64 = 13.9e-6;

    /// Tokens in one block of NxD's blockwise MoE matmul (context encoding): 512.
    ///
    /// The expert MLPs of a context-encoding step run as blocks of this many token rows, each
    /// block one expert's: `ceil((T * top_k - (E - 1)) / B) + E - 1` blocks (at most
    /// `T * top_k`), the worst case of any routing, computed whatever the routing (`[S39]`,
    /// `DEFAULT_BLOCK_SIZE`).
    #[spec(unit = "count", source = "[S39] D")]
    pub const WORKLOAD_MOE_BLOCK_TOKENS: usize = 512;

    /// What serving through vLLM adds to each output token over the model's own step: 1.6 ms.
    ///
    /// The DeepSeek-V3 contrib README `[S37]` measures 20.5 ms per token with NxD Inference's
    /// own benchmark and 22.1 ms best (22.2 ms synchronous) inter-token latency through vLLM
    /// at batch 1. The tutorials' LLMPerf runs go through vLLM.
    #[spec(unit = "s", source = "[S37] I")]
    pub const SERVING_VLLM_TOKEN_OVERHEAD_S: f64 = 22.1e-3 - 20.5e-3;

    /// What serving through vLLM adds to the time to first token of a request: about 33 ms.
    ///
    /// The same README `[S37]`: 1,667 ms context encoding natively, "~1,700 ms" through vLLM at
    /// every batch size. The published figure is rounded, so this is known to about +-50 ms: a
    /// guess that matters only for short prompts.
    #[spec(unit = "s", source = "[S37] I")]
    pub const SERVING_VLLM_REQUEST_OVERHEAD_S: f64 = 1.700 - 1.667;

    /// HBM the Neuron runtime's micro-code takes on each physical core: 96 MiB.
    ///
    /// The runtime's device-memory guide `[S40]` counts "a micro-code overhead of 96MB per
    /// physical Neuron Core" in every core's model code (its OOM table prints 96.065MB for a
    /// core with two tiny NEFFs loaded; the runtime's tables count in binary units). A memory
    /// plan reserves it per physical core of a logical core (`runtime_reserve`).
    #[spec(unit = "B", source = "[S40] D")]
    pub const RUNTIME_MICROCODE_BYTES_PER_CORE: u64 = 96 << 20;

    /// The Neuron runtime's default scratchpad page: 512 MiB, the unit a NEFF's scratchpad (its spilled intermediates) is allocated in.
    ///
    /// The device-memory guide `[S40]`: a NEFF's scratchpad variables live in shared pages of
    /// `NEURON_SCRATCHPAD_PAGE_SIZE` (default 512 MB) on each core, shared by the NEFFs loaded
    /// there; an LNC=2 NEFF has a subgraph (`sg00`, `sg01`) per physical core. The DeepSeek-V3
    /// contrib README `[S37]` names a "CTE scratchpad (512MB)" as what did not fit beside the
    /// token-generation model at seq_len 1024. A memory plan rounds the activations up to whole
    /// pages, at least one per physical core (that each physical core holds its own page is our
    /// reading of the per-core subgraphs and of NxD Inference's long-context option
    /// `NEURON_RT_DBG_SCRATCHPAD_ON_SINGLE_CORE`); Runtime 2.33's contiguous scratchpad (64 MB
    /// steps) is newer than every published run.
    #[spec(unit = "B", source = "[S40][S37] D")]
    pub const RUNTIME_SCRATCHPAD_PAGE_BYTES: u64 = 512 << 20;

    /// HBM accesses for a chunk to traverse two ranks of a Ring AllGather (two 1R1W hops).
    #[spec(unit = "count", source = "[S16] D")]
    pub const RING_ALLGATHER_HBM_ACCESSES_PER_TWO_RANKS: usize = 4;

    /// HBM accesses for the same traversal in KangaRing AllGather (one 1R2W): 25 % fewer.
    #[spec(unit = "count", source = "[S16] D")]
    pub const KANGARING_ALLGATHER_HBM_ACCESSES_PER_TWO_RANKS: usize = 3;

    /// HBM accesses for a chunk to traverse two ranks of a Ring ReduceScatter (two 2R1W hops).
    #[spec(unit = "count", source = "[S16] D")]
    pub const RING_REDUCE_SCATTER_HBM_ACCESSES_PER_TWO_RANKS: usize = 6;

    /// HBM accesses for the same traversal in KangaRing ReduceScatter (one 3R1W): 33 % fewer.
    #[spec(unit = "count", source = "[S16] D")]
    pub const KANGARING_REDUCE_SCATTER_HBM_ACCESSES_PER_TWO_RANKS: usize = 4;

    // ============================== fidelity: calibration residuals ==============================
    // Every report prints its time with the range the published cases of its kind fell in
    // (`perf::Uncertainty`): published / predicted, lowest and highest, over the points of
    // benches/fidelity/published.toml compared with the model (`use = "check"`, high and medium
    // confidence). `python benches/fidelity_table.py --fit` prints them; tests/test_fidelity.py checks
    // these values against it.

    /// Lowest published / predicted time over the published collective cases (nccom-test rows).
    ///
    /// Rounded outward to two decimals (so are the other ranges). The 32-rank all-gather of
    /// 1 KiB (`allg-r32-1KiB`, 6.16 us) is half the model's, the 4-rank one (`allgv-r4-2KiB`,
    /// 16.28 us) twice: fewer ranks took longer, which no transfer model reproduces
    /// (docs/fidelity.md).
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const COLLECTIVE_PUBLISHED_RATIO_LOW: f64 = 0.50;

    /// Highest published / predicted time over the published collective cases.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const COLLECTIVE_PUBLISHED_RATIO_HIGH: f64 = 2.15;

    /// Published collective cases the collective range is taken over.
    #[spec(unit = "count", source = "[F] calibrated")]
    pub const COLLECTIVE_PUBLISHED_CASES: usize = 17;

    /// Lowest published / predicted time over the published DMA transfers.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const DMA_PUBLISHED_RATIO_LOW: f64 = 0.96;

    /// Highest published / predicted time over the published DMA transfers.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const DMA_PUBLISHED_RATIO_HIGH: f64 = 1.02;

    /// Published DMA cases the DMA range is taken over.
    #[spec(unit = "count", source = "[F] calibrated")]
    pub const DMA_PUBLISHED_CASES: usize = 6;

    /// Lowest published / predicted time over the published GEMM kernels.
    ///
    /// One case (an fp32 `4096 x 8192 x 8192` kernel, compute-bound): no published Trn2 GEMM is
    /// memory-bound, so the range says nothing about the memory side.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const GEMM_PUBLISHED_RATIO_LOW: f64 = 1.01;

    /// Highest published / predicted time over the published GEMM kernels.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const GEMM_PUBLISHED_RATIO_HIGH: f64 = 1.02;

    /// Published GEMM cases the GEMM range is taken over.
    #[spec(unit = "count", source = "[F] calibrated")]
    pub const GEMM_PUBLISHED_CASES: usize = 1;

    /// Lowest published / predicted time over the published whole-model time-to-first-token cases.
    ///
    /// The checked prefill points of benches/fidelity/published.toml (kind `model`), the
    /// tutorial baselines among them (docs/workload.md).
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const WORKLOAD_PREFILL_PUBLISHED_RATIO_LOW: f64 = 0.72;

    /// Highest published / predicted time over the published whole-model time-to-first-token cases.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const WORKLOAD_PREFILL_PUBLISHED_RATIO_HIGH: f64 = 1.12;

    /// Published whole-model time-to-first-token cases the range is taken over.
    #[spec(unit = "count", source = "[F] calibrated")]
    pub const WORKLOAD_PREFILL_PUBLISHED_CASES: usize = 16;

    /// Lowest published / predicted time over the published whole-model time-per-token cases.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const WORKLOAD_DECODE_PUBLISHED_RATIO_LOW: f64 = 0.70;

    /// Highest published / predicted time over the published whole-model time-per-token cases.
    #[spec(unit = "ratio", source = "[F] calibrated")]
    pub const WORKLOAD_DECODE_PUBLISHED_RATIO_HIGH: f64 = 1.55;

    /// Published whole-model time-per-token cases the range is taken over.
    #[spec(unit = "count", source = "[F] calibrated")]
    pub const WORKLOAD_DECODE_PUBLISHED_CASES: usize = 16;

    // ======================================= FP8 maxima =========================================

    /// Largest finite float8_e4m3 (Neuron's IEEE-style FP8_EXP4) value: 240.
    #[spec(unit = "dimensionless", source = "[S22][S23][S26] D")]
    pub const FP8_E4M3_MAX: f64 = 240.0;

    /// Largest finite float8_e5m2 value: 57,344.
    #[spec(unit = "dimensionless", source = "[S23] D")]
    pub const FP8_E5M2_MAX: f64 = 57344.0;

    /// Largest finite float8_e4m3fn (OCP, no Inf) value: 448 (numerics only, not on Trn2's PE).
    #[spec(unit = "dimensionless", source = "[S11][S22] D")]
    pub const FP8_E4M3FN_MAX: f64 = 448.0;

    /// Largest finite float8_e3m4 (FP8_E3, IEEE-style, bias 3) value: 15.5.
    #[spec(unit = "dimensionless", source = "[S8] I")]
    pub const FP8_E3M4_MAX: f64 = 15.5;
}

// ---------------------------------------------------------------------------------------------
// Small arrays built from the scalar constants above (each element is itself in `ENTRIES`, except
// the sparsity patterns, whose bounds are `SPARSE_MAX_GROUP_ELEMENTS` and
// `SPARSE_MAX_THROUGHPUT_FACTOR`).
// ---------------------------------------------------------------------------------------------

/// PE tile sizes (rows; also the candidate column sizes) an `nc_matmul` may use: 128, 64, 32.
///
/// Source: `[S9][S10]` D (4 × 32 row tiling is new in NCv3). Tile starts are multiples of the
/// tile size.
pub const PE_ROW_TILE_SIZES: [usize; 3] = [PE_TILE_FULL, PE_TILE_HALF, PE_TILE_QUARTER];

/// Logical NeuronCore sizes trn2core accepts: 1 and 2 (documented, `[S6]`) and 4 (extension).
pub const LNC_ALLOWED: [usize; 3] = [1, LNC_MAX_DOCUMENTED, LNC_MAX];

/// N:M structured-sparsity patterns of the tensor engine, as `(n, m)` = at most `n` stored values
/// in every group of `m`, in the API contract's order.
///
/// Source: `[S4]` D. **Conflict:** the (unreleased) NKI text lists only 4:8, 4:12, 4:16 `[S1]`; the
/// NeuronCore-v3 page lists all seven, which the project follows.
pub const SPARSITY_PATTERNS: [(usize, usize); 7] =
    [(1, 2), (2, 4), (1, 4), (2, 8), (4, 8), (4, 12), (4, 16)];

// Orderings between constants that the models rely on, checked at compile time.
const _: () = {
    assert!(SBUF_USABLE_PARTITION_BYTES < SBUF_PARTITION_BYTES);
    assert!(HBM_STACK_BYTES <= HBM_STACK_ADDRESS_WINDOW_BYTES);
    assert!(DMA_OVERHEAD_BOUND_PARTITION_BYTES < DMA_RECOMMENDED_PARTITION_BYTES);
    assert!(DMA_RECOMMENDED_PARTITION_BYTES < DMA_FULL_RATE_PARTITION_BYTES);
    assert!(COLLECTIVE_MESH_MAX_BYTES < COLLECTIVE_RDH_MAX_BYTES);
    assert!(RING_HOP_LATENCY_MIN_S <= RING_HOP_LATENCY_S);
    assert!(RING_HOP_LATENCY_S <= RING_HOP_LATENCY_MAX_S);
    assert!(MATMUL_MOVING_FREE_MAX as u64 * 4 == PSUM_BANK_BYTES);
};

// ---------------------------------------------------------------------------------------------
// The table the Python binding exposes.
// ---------------------------------------------------------------------------------------------

/// One row of the table the Python binding exposes read-only as `trn2core.spec`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecEntry {
    /// The constant's name in lower_snake_case, e.g. `"pe_clock_hz"`.
    pub name: &'static str,
    /// The constant's value (integers converted exactly; all are below 2^53).
    pub value: f64,
    /// Unit, e.g. `"Hz"`, `"B"`, `"B/s"`, `"s"`, `"cycles"`, `"TFLOPS"`, `"count"`, `"ratio"`.
    pub unit: &'static str,
    /// Source tag(s) and status, e.g. `"[S1] D"`.
    pub source: &'static str,
    /// One sentence saying what the number is.
    pub doc: &'static str,
    /// The rest of the constant's doc comment, one source line per line (each with its
    /// leading space): what a status `C` or `I` promises, the values that conflict or the
    /// derivation, and why this one was chosen. Empty when the summary says it all.
    pub note: &'static str,
}

/// Looks up an entry of [`ENTRIES`] by its lower_snake_case name.
pub fn entry(name: &str) -> Option<&'static SpecEntry> {
    ENTRIES.iter().find(|e| e.name == name)
}

impl SpecEntry {
    /// The entry's status letter (`"D"`, `"I"` or `"C"`, defined in [`STATUSES`]): the last
    /// word of [`SpecEntry::source`].
    pub fn status(&self) -> &'static str {
        let source = self.source.trim_end();
        source.rsplit(' ').next().unwrap_or(source)
    }

    /// The source tags the entry cites, in order and once each, without brackets: `["S3", "S5"]`.
    /// Each resolves to a row of [`SOURCES`].
    pub fn tags(&self) -> Vec<&'static str> {
        let mut tags: Vec<&'static str> = Vec::new();
        for tag in tags_in(self.source) {
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
        tags
    }
}

/// The bracketed source tags (`[S12]`, `[P]`) of a source string, without brackets, in order.
fn tags_in(text: &'static str) -> impl Iterator<Item = &'static str> {
    text.split('[').skip(1).filter_map(|rest| {
        let inner = &rest[..rest.find(']')?];
        let is_tag = inner == "P"
            || inner == "F"
            || (inner.len() > 1
                && inner.starts_with('S')
                && inner[1..].bytes().all(|b| b.is_ascii_digit()));
        is_tag.then_some(inner)
    })
}

// ---------------------------------------------------------------------------------------------
// Where the numbers come from: the status letters and the sources the tags name. The project's
// docs/sources.md lists the same rows (a test checks that they agree), and Python reads them as
// `trn2core.spec.statuses()`, `trn2core.spec.source(tag)` and `trn2core.spec.sources()`.
// ---------------------------------------------------------------------------------------------

/// What a status letter of [`SpecEntry::source`] means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The letter, e.g. `"D"`.
    pub letter: &'static str,
    /// One word, e.g. `"documented"`.
    pub name: &'static str,
    /// What the letter says about the value.
    pub meaning: &'static str,
}

/// The status letters, the one legend every doc of the project uses.
pub const STATUSES: &[Status] = &[
    Status {
        letter: "D",
        name: "documented",
        meaning: "the cited source states the value, verbatim or nearly",
    },
    Status {
        letter: "I",
        name: "inferred",
        meaning: "derived by us from cited facts (arithmetic, a reading of code) or a modelling \
                  assumption where no source gives a number; the note says which",
    },
    Status {
        letter: "C",
        name: "conflict",
        meaning: "the sources disagree; the note gives every value and why this one was chosen",
    },
    Status {
        letter: "calibrated",
        name: "calibrated",
        meaning: "fitted to published Trainium2 measurements (tag [F], docs/fidelity.md); the \
                  note names the points it was fitted on",
    },
];

/// One source a hardware number cites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The tag without brackets, e.g. `"S3"`.
    pub tag: &'static str,
    /// The document's title, as the page or file heads it.
    pub title: &'static str,
    /// Where to read it (empty only for `P`, which has no public address).
    pub url: &'static str,
    /// Further documents the same tag covers.
    pub also: &'static [&'static str],
    /// Which version was read, and when.
    pub read: &'static str,
}

/// `neuron_doc!("a/b")`: the rendered page of `a/b.rst` in AWS's Neuron documentation.
macro_rules! neuron_doc {
    ($path:literal) => {
        concat!("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/", $path, ".html")
    };
}

/// The version of the Neuron documentation the `neuron_doc!` pages were read at.
macro_rules! neuron_docs_read {
    () => {
        "Neuron SDK 2.32 docs: aws-neuron/aws-neuron-sdk at 81ce03ae (2026-08-21)"
    };
}

/// Every source tag the project uses, in tag order: `[S1]`…`[S40]` (public documents and
/// repositories) and `[P]`.
pub const SOURCES: &[Source] = &[
    Source {
        tag: "S1",
        title: "Trainium2 Architecture Guide for NKI",
        url: neuron_doc!("nki/guides/architecture/trainium2_arch"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2025-12-01 (older text where a note says so)"),
    },
    Source {
        tag: "S2",
        title: "Trainium/Inferentia2 Architecture Guide for NKI",
        url: neuron_doc!("nki/guides/architecture/trainium_inferentia2_arch"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; the NeuronCore-v2 baseline that S1 says still applies"),
    },
    Source {
        tag: "S3",
        title: "Trainium2 Architecture",
        url: neuron_doc!("about-neuron/arch/neuron-hardware/trainium2"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; before 2025-12-01 it said 20 CC-Cores"),
    },
    Source {
        tag: "S4",
        title: "NeuronCore-v3 Architecture",
        url: neuron_doc!("about-neuron/arch/neuron-hardware/neuron-core-v3"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S5",
        title: "Amazon EC2 Trn2 Architecture",
        url: neuron_doc!("about-neuron/arch/neuron-hardware/trn2-arch"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S6",
        title: "Logical NeuronCore configuration",
        url: neuron_doc!("about-neuron/arch/neuron-features/logical-neuroncore-config"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S7",
        title: "Neuron Rounding Modes",
        url: neuron_doc!("about-neuron/arch/neuron-features/rounding-modes"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S8",
        title: "Data Types",
        url: neuron_doc!("about-neuron/arch/neuron-features/data-types"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S9",
        title: "NKI ISA API reference (nki.isa), e.g. nki.isa.nc_matmul",
        url: neuron_doc!("nki/api/generated/nki.isa.nc_matmul"),
        also: &["https://github.com/aws-neuron/aws-neuron-sdk/blob/81ce03ae261e12925e53437a0f690478e6366155/nki/api/nki/isa/__init__.py"],
        read: concat!(neuron_docs_read!(), "; the docstrings every nki.isa page is generated from"),
    },
    Source {
        tag: "S10",
        title: "NKI ISA API reference with its \"Estimated instruction cost\" sections (removed from later docs)",
        url: "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/nki/api/generated/nki.isa.nc_matmul.html",
        also: &[
            "https://github.com/aws-neuron/aws-neuron-sdk/blob/0521004ce0ba18aa5313a835aacaabb31543af37/general/nki/api/nki/isa/__init__.py",
            "https://github.com/aws-neuron/aws-neuron-sdk/blob/44d4fd2735bf9222bf93b8d6c03fbe10035592e4/general/nki/api/nki/isa/__init__.py",
        ],
        read: "Neuron SDK 2.26.0 (aws-neuron-sdk 0521004c, 2025-09-19) and 2.23.0 (44d4fd27, 2025-05-20)",
    },
    Source {
        tag: "S11",
        title: "NKI ISA API Common Fields (data types, ALU operators, activation functions)",
        url: neuron_doc!("nki/api/nki.api.shared"),
        also: &["https://github.com/aws-neuron/aws-neuron-sdk/blob/81ce03ae261e12925e53437a0f690478e6366155/nki/api/nki/language/__init__.py"],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S12",
        title: "Introduction to Direct Memory Access (DMA) with NKI",
        url: neuron_doc!("nki/get-started/about/nki-dma-overview"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S13",
        title: "Guideline to Avoid Under-Utilizing DMA Bandwidth",
        url: neuron_doc!("nki/deep-dives/nki-dma-bandwidth-guide"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2026-04-12"),
    },
    Source {
        tag: "S14",
        title: "Descriptor Generation Engine (DGE) Reference",
        url: neuron_doc!("nki/deep-dives/nki-dge"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2026-03-31"),
    },
    Source {
        tag: "S15",
        title: "What is Neuron Collective Communication?",
        url: neuron_doc!("neuron-runtime/about/collectives"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2025-12-02"),
    },
    Source {
        tag: "S16",
        title: "Intra-node Collective Communications with AWS Neuron",
        url: neuron_doc!("neuron-runtime/explore/intranode-collective-comm"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2025-12-02"),
    },
    Source {
        tag: "S17",
        title: "Compute-Communication Overlap in Neuron",
        url: neuron_doc!("neuron-runtime/explore/compute-comm-overlap"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S18",
        title: "Neuron Explorer Glossary; Summary Viewer (throttling)",
        url: neuron_doc!("tools/neuron-explorer/glossary"),
        also: &[neuron_doc!("tools/neuron-explorer/overview-summary-page")],
        read: concat!(neuron_docs_read!(), "; pages dated 2026-06-18 and 2026-03-20"),
    },
    Source {
        tag: "S19",
        title: "Trainium3 Architecture Guide for NKI (what changed from NeuronCore-v3)",
        url: neuron_doc!("nki/guides/architecture/trainium3_arch"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2026-03-09"),
    },
    Source {
        tag: "S20",
        title: "Developer Guide - NeuronX Runtime; JAX NeuronX Environment Variables",
        url: neuron_doc!("neuron-runtime/guides/nrt-developer-guide"),
        also: &[neuron_doc!("frameworks/jax/api-reference-guide/neuron-envvars")],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S21",
        title: "Neuron Compiler CLI Reference Guide (neuronx-cc); error codes NCC_EVRF051, 052, 061, 063",
        url: neuron_doc!("compiler/neuronx-cc/api-reference-guide/index"),
        also: &[
            neuron_doc!("compiler/error-codes/EVRF051"),
            neuron_doc!("compiler/error-codes/EVRF052"),
            neuron_doc!("compiler/error-codes/EVRF061"),
            neuron_doc!("compiler/error-codes/EVRF063"),
        ],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S22",
        title: "Why we need to rescale FP8 weights (neuronx-distributed)",
        url: "https://github.com/aws-neuron/neuronx-distributed/blob/3aa65c661c45f133a99052746ed70a0121d0e695/src/neuronx_distributed/quantization/README_rescaling_fp8_for_neuron.md",
        also: &[],
        read: "aws-neuron/neuronx-distributed at 3aa65c66 (2024-12-19)",
    },
    Source {
        tag: "S23",
        title: "NKI Library kernel helpers (FP8 maxima, PSUM constants) and top-k cost heuristics",
        url: "https://github.com/aws-neuron/nki-library/blob/d2ad3a579498d1888aa8740af97fd325dd5f2740/src/nkilib_src/nkilib/core/utils/kernel_helpers.py",
        also: &["https://github.com/aws-neuron/nki-library/blob/d2ad3a579498d1888aa8740af97fd325dd5f2740/src/nkilib_src/nkilib/core/topk/rotational_topk_utils.py"],
        read: "aws-neuron/nki-library at d2ad3a57 (2026-04-13)",
    },
    Source {
        tag: "S24",
        title: "nkipy HardwareConstants.h (mirrors the NKI tracer's target info)",
        url: "https://github.com/aws-neuron/nkipy/blob/b91c9800bb096d1686befcd43fe9e92b408d4912/nkigen/mlir/include/nkipy/Transforms/HardwareConstants.h",
        also: &[],
        read: "aws-neuron/nkipy at b91c9800 (2026-08-04)",
    },
    Source {
        tag: "S25",
        title: "Neuron kernel driver, Trainium2 (v3) address map and hardware abstraction layer",
        url: "https://github.com/aws-neuron/aws-neuron-driver/blob/fca19f7df31b44cbbffaf121230a66df6f59d118/v3/address_map.h",
        also: &[
            "https://github.com/aws-neuron/aws-neuron-driver/blob/fca19f7df31b44cbbffaf121230a66df6f59d118/v3/neuron_dhal_v3.c",
            "https://github.com/aws-neuron/aws-neuron-driver/blob/fca19f7df31b44cbbffaf121230a66df6f59d118/v3/neuron_pelect.c",
        ],
        read: "aws-neuron/aws-neuron-driver at fca19f7d (2025-09-19)",
    },
    Source {
        tag: "S26",
        title: "nki-samples FP8 double-row matmul reference kernel and its test",
        url: "https://github.com/aws-neuron/nki-samples/blob/a5e9d8cc2bd804e5ee002bee19cb40e5d9d1b38c/src/nki_samples/reference/double_row_matmul.py",
        also: &[],
        read: "aws-neuron/nki-samples at a5e9d8cc (2025-04-09)",
    },
    Source {
        tag: "S27",
        title: "Trainium2 architecture; Amazon EC2 Trn2 architecture (launch versions of S3 and S5)",
        url: "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.21.0.beta/general/arch/neuron-hardware/trainium2.html",
        also: &["https://awsdocs-neuron.readthedocs-hosted.com/en/v2.21.0.beta/general/arch/neuron-hardware/trn2-arch.html"],
        read: "Neuron SDK 2.21.0 beta: aws-neuron-sdk at 2086a70a (2024-12-03)",
    },
    Source {
        tag: "S28",
        title: "SemiAnalysis: Amazon's AI Self Sufficiency — Trainium2 Architecture & Networking",
        url: "https://semianalysis.com/2024/12/03/amazons-ai-self-sufficiency-trainium2-architecture-networking/",
        also: &["https://tengele.com/news/004e498c-7f1c-4a14-9d0d-4d415e093d34/amazons-ai-self-sufficiency-trainium2-architecture-networking"],
        read: "published 2024-12-03; only the free introduction and a summary (the second address) were read",
    },
    Source {
        tag: "S29",
        title: "Tom's Hardware: AWS building ExaFLOPS-class supercomputer for AI with hundreds of thousands of homegrown Trainium2 processors",
        url: "https://d33gy59ovltp76.cloudfront.net/news/aws-building-exaflops-class-supercomputer-for-ai-with-hundreds-of-thousands-homegrown-trainium2-processors-aws-forges-a-path-without-nvidia-gpus",
        also: &[],
        read: "re:Invent 2024 article (December 2024), read through this mirror of the magazine's page",
    },
    Source {
        tag: "S30",
        title: "NKI CPU Simulator; Release Notes for Neuron Component: Neuron Kernel Interface (NKI)",
        url: neuron_doc!("nki/guides/nki_simulator"),
        also: &[neuron_doc!("release-notes/components/nki")],
        read: concat!(neuron_docs_read!(), "; simulator page dated 2026-05-11"),
    },
    Source {
        tag: "S31",
        title: "NKI tutorial: Matrix multiplication (roofline threshold)",
        url: neuron_doc!("nki/guides/tutorials/matrix_multiplication"),
        also: &[],
        read: concat!(neuron_docs_read!(), "; page dated 2025-12-01"),
    },
    Source {
        tag: "S32",
        title: "NKI Performance Optimizations; The Trainium Memory Hierarchy",
        url: neuron_doc!("nki/deep-dives/nki_perf_guide"),
        also: &[neuron_doc!("nki/get-started/about/memory-hierarchy-overview")],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S33",
        title: "NKI Access Patterns; nki.language.tile_size",
        url: neuron_doc!("nki/deep-dives/nki-aps"),
        also: &[neuron_doc!("nki/api/nki.language.tile_size")],
        read: concat!(neuron_docs_read!(), "; access-pattern page dated 2025-12-19"),
    },
    Source {
        tag: "S34",
        title: "Using Logical Neuron Cores (LNC); NKI Library attention-block sharding design spec",
        url: neuron_doc!("nki/get-started/about/lnc"),
        also: &["https://github.com/aws-neuron/nki-library/blob/d2ad3a579498d1888aa8740af97fd325dd5f2740/src/nkilib_src/nkilib/experimental/transformer/attention_block_tkg_sharding_design_spec.md"],
        read: concat!(neuron_docs_read!(), "; aws-neuron/nki-library at d2ad3a57 (2026-04-13)"),
    },
    Source {
        tag: "S35",
        title: "nrt.h (Neuron runtime API); Work with NEFF Files; JAX NeuronX Known Issues",
        url: neuron_doc!("neuron-runtime/api/nrt"),
        also: &[
            neuron_doc!("neuron-runtime/explore/work-with-neff-files"),
            neuron_doc!("frameworks/jax/setup/jax-neuronx-known-issues"),
        ],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S36",
        title: "Mooncake pull request 3888: move AWS Neuron (Trainium) HBM directly over EFA (trn2.48xlarge measurements)",
        url: "https://github.com/kvcache-ai/Mooncake/pull/3888",
        also: &[],
        read: "kvcache-ai/Mooncake pull request 3888 (open), read 2026-09; third-party measurement, not AWS",
    },
    Source {
        tag: "S37",
        title: "neuronx-distributed-inference contrib model README: DeepSeek-V3 (Trn2 benchmarks and profile)",
        url: "https://github.com/aws-neuron/neuronx-distributed-inference/blob/4bcdc54bf3b6ccdad490e5cd0680a3dc95270b8e/contrib/models/DeepSeek-V3/README.md",
        also: &[],
        read: "aws-neuron/neuronx-distributed-inference at 4bcdc54b (2026-07-28); measured with Neuron SDK 2.28",
    },
    Source {
        tag: "S38",
        title: "neuronx-distributed-inference contrib model README and code: Trinity (AfmoeForCausalLM; Trn2 benchmarks, architecture, head padding)",
        url: "https://github.com/aws-neuron/neuronx-distributed-inference/blob/4bcdc54bf3b6ccdad490e5cd0680a3dc95270b8e/contrib/models/Trinity/README.md",
        also: &["https://github.com/aws-neuron/neuronx-distributed-inference/blob/4bcdc54bf3b6ccdad490e5cd0680a3dc95270b8e/contrib/models/Trinity/src/modeling_trinity.py"],
        read: "aws-neuron/neuronx-distributed-inference at 4bcdc54b (2026-07-28); README benchmarked with Neuron SDK 2.28 (2026-03)",
    },
    Source {
        tag: "S39",
        title: "neuronx-distributed: the MoE expert MLPs' blockwise matmul (worst-case block count, default block size)",
        url: "https://github.com/aws-neuron/neuronx-distributed/blob/fbac349b61a3adbb123c2983835af692840ff62f/src/neuronx_distributed/modules/moe/expert_mlps_v2.py",
        also: &["https://github.com/aws-neuron/neuronx-distributed/blob/fbac349b61a3adbb123c2983835af692840ff62f/src/neuronx_distributed/modules/moe/model_utils.py"],
        read: "aws-neuron/neuronx-distributed at fbac349b (2026-04-09)",
    },
    Source {
        tag: "S40",
        title: "Neuron device memory (the runtime's HBM categories: model code, scratchpad pages, DMA rings, collectives)",
        url: neuron_doc!("neuron-runtime/explore/device-memory"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "S41",
        title: "George Marsaglia, Xorshift RNGs (Journal of Statistical Software 8(14), 2003): the \
                xorwow generator the NKI docs name for rand_set_state",
        url: "https://doi.org/10.18637/jss.v008.i14",
        also: &[],
        read: "the paper's xorwow code (state x, y, z, w, v, d; d += 362437)",
    },
    Source {
        tag: "S42",
        title: "Neuron Explorer: Profile Parquet Schema Reference (spill_save_bytes, \
                spill_reload_bytes: \"Spilled data is the intermediate tensors computed by the \
                engines\"; weight_queue_bytes: weights \"loaded multiple times or spilled and \
                reloaded\")",
        url: neuron_doc!("tools/neuron-explorer/profile-schema-reference"),
        also: &[],
        read: neuron_docs_read!(),
    },
    Source {
        tag: "P",
        title: "The product description of Trainium2 trn2core was specified from (an encyclopedia-style \
                article \"AWS Trainium 2\", last reviewed 2026-05-17)",
        url: "",
        also: &[],
        read: "not public, so not checkable by a user: used only where no AWS document gives a \
               number (per-link NeuronLink bandwidths, the trn2.3xlarge, LNC=4)",
    },
    Source {
        tag: "F",
        title: "trn2core's calibration against every published Trainium2 measurement \
                (docs/fidelity.md; the points are in benches/fidelity/published.toml, each with \
                its own public address)",
        url: "",
        also: &[],
        read: "the fit itself is in this project: `python benches/fidelity_table.py --fit` recomputes \
               each calibrated value from the published points its note names",
    },
];

/// Looks up a source by its tag, with or without brackets: `source("S3")`, `source("[S3]")`.
pub fn source(tag: &str) -> Option<&'static Source> {
    let tag = tag.trim();
    let tag = tag.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(tag);
    SOURCES.iter().find(|s| s.tag == tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn core_peaks_follow_the_clock() {
        assert_eq!(CORE_PEAK_BF16_FLOPS_PER_S, 128.0 * 128.0 * 2.0 * 2.4e9);
        assert!((CORE_PEAK_BF16_FLOPS_PER_S / 1e12 - 78.6).abs() < 0.1);
        assert_eq!(CORE_PEAK_FP8_DOUBLE_ROW_FLOPS_PER_S, 2.0 * CORE_PEAK_BF16_FLOPS_PER_S);
        assert_eq!(CORE_PEAK_FP32_FLOPS_PER_S, CORE_PEAK_BF16_FLOPS_PER_S / 4.0);
        assert_eq!(CORE_PEAK_SPARSE_FLOPS_PER_S, 4.0 * CORE_PEAK_BF16_FLOPS_PER_S);
        // The documented per-core figures are the derived ones rounded (within 2 %).
        for (derived, documented) in [
            (CORE_PEAK_BF16_FLOPS_PER_S, CORE_DOCUMENTED_BF16_TFLOPS),
            (CORE_PEAK_FP8_DOUBLE_ROW_FLOPS_PER_S, CORE_DOCUMENTED_FP8_TFLOPS),
            (CORE_PEAK_FP32_FLOPS_PER_S, CORE_DOCUMENTED_FP32_TFLOPS),
            (CORE_PEAK_SPARSE_FLOPS_PER_S, CORE_DOCUMENTED_SPARSE_TFLOPS),
        ] {
            assert!(close(derived / 1e12, documented, 0.02), "{derived} vs {documented}");
        }
        // One full 128x128x512 BF16 matmul: 512 PE cycles = 213 ns at 78.6 TFLOPS.
        let cycles = MM_INIT_LATENCY_CYCLES.max(MATMUL_MOVING_FREE_MAX) as f64;
        let flops = (2 * PE_ROWS * PE_COLS * MATMUL_MOVING_FREE_MAX) as f64;
        assert_eq!(flops / (cycles / PE_CLOCK_HZ), CORE_PEAK_BF16_FLOPS_PER_S);
    }

    #[test]
    fn neuronlink_links_add_up_to_the_chip_total() {
        let dirs = NEURONLINK_DIRECTIONS as f64;
        let intra = NEURONLINK_XY_LINKS_PER_CHIP as f64 * NEURONLINK_XY_LINK_BYTES_PER_S * dirs;
        let inter = NEURONLINK_Z_LINKS_PER_CHIP as f64 * NEURONLINK_Z_LINK_BYTES_PER_S * dirs;
        assert_eq!(intra, NEURONLINK_INTRA_INSTANCE_BYTES_PER_S);
        assert_eq!(inter, NEURONLINK_INTER_INSTANCE_BYTES_PER_S);
        assert_eq!(intra + inter, NEURONLINK_CHIP_BYTES_PER_S);
        assert_eq!(intra + inter, 1.28e12);
    }

    #[test]
    fn memories_have_their_documented_sizes() {
        assert_eq!(SBUF_BYTES, 28 * MIB);
        assert_eq!(SBUF_CHIP_BYTES, 224 * MIB);
        assert_eq!(PSUM_BYTES, 2 * MIB);
        assert_eq!(PSUM_BANK_FP32_ELEMENTS, 512);
        assert_eq!(MATMUL_MOVING_FREE_MAX, 512);
        assert_eq!(HBM_CHIP_BYTES, 96 * GIB);
        assert_eq!(
            HBM_STACKS_PER_CHIP * CORES_PER_HBM_STACK,
            CORES_PER_CHIP,
            "every core shares exactly one stack"
        );
        assert_eq!(HBM_CORE_SHARE_BYTES_PER_S * CORES_PER_CHIP as f64, HBM_CHIP_BYTES_PER_S);
    }

    #[test]
    fn dma_rates_are_consistent() {
        assert_eq!(DMA_CORE_BYTES_PER_S, 368e9);
        assert_eq!(DMA_ENGINES_PER_CHIP, 128);
        assert_eq!(DMA_PARTITIONS_PER_ENGINE, 8);
        // 128 engines at the theoretical rate give the chip's 3.5 TB/s (within 1 %).
        let theoretical = DMA_ENGINES_PER_CHIP as f64 * DMA_ENGINE_THEORETICAL_BYTES_PER_S;
        assert!(close(theoretical, DMA_CHIP_BYTES_PER_S, 0.01));
        // The measured 32 KiB transfer supports the effective 23 B/ns (within 1 %).
        let measured = DMA_MEASURED_EXAMPLE_BYTES as f64 / DMA_MEASURED_EXAMPLE_S;
        assert!(close(measured, DMA_ENGINE_BYTES_PER_S, 0.01));
    }

    #[test]
    fn every_conflict_carries_its_note() {
        // Status C promises a note giving every value and why one was chosen.
        for e in ENTRIES.iter().filter(|e| e.status() == "C") {
            assert!(e.note.contains("onflict"), "{} has no conflict note", e.name);
        }
        let cc = entry("cc_cores_per_chip").expect("listed");
        assert!(cc.note.contains("Chosen 16"), "{:?}", cc.note);
        assert_eq!(entry("cores_per_chip").expect("listed").note, "");
    }

    #[test]
    fn topology_counts_are_consistent() {
        assert_eq!(CHIPS_PER_INSTANCE, 16);
        assert_eq!(CHIPS_PER_ULTRASERVER, 64);
        assert_eq!(CC_CORES_PER_CHIP, CC_CORES_PER_CORE * CORES_PER_CHIP);
        assert_eq!(CORES_PER_DIE, 4);
        assert_eq!(EFA_INSTANCE_BITS_PER_S, EFA_CHIP_BITS_PER_S * CHIPS_PER_INSTANCE as f64);
        for lnc in LNC_ALLOWED {
            assert_eq!(CORES_PER_CHIP % lnc, 0);
            assert!(lnc <= CORES_PER_DIE, "a logical core stays on one die");
        }
        for (n, m) in SPARSITY_PATTERNS {
            assert!(n < m && m <= SPARSE_MAX_GROUP_ELEMENTS);
            assert!(m / n <= SPARSE_MAX_THROUGHPUT_FACTOR);
        }
        for size in PE_ROW_TILE_SIZES {
            assert_eq!(PE_ROWS % size, 0);
        }
    }

    #[test]
    fn entries_are_well_formed() {
        assert!(ENTRIES.len() > 100);
        for (i, e) in ENTRIES.iter().enumerate() {
            assert!(!e.source.trim().is_empty(), "{} has no source", e.name);
            assert!(e.source.contains('['), "{}: source lacks a tag", e.name);
            assert!(
                e.source.ends_with(" D")
                    || e.source.ends_with(" I")
                    || e.source.ends_with(" C")
                    || e.source.ends_with("[F] calibrated"),
                "{}: source lacks a D/I/C/calibrated status",
                e.name
            );
            assert!(!e.unit.is_empty() && !e.doc.is_empty(), "{}", e.name);
            assert!(e.doc.ends_with('.'), "{}: doc is not a sentence", e.name);
            assert!(e.value.is_finite() && e.value >= 0.0, "{}", e.name);
            assert!(
                e.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{} is not lower_snake_case",
                e.name
            );
            assert!(
                ENTRIES[..i].iter().all(|earlier| earlier.name != e.name),
                "duplicate entry {}",
                e.name
            );
        }
    }

    #[test]
    fn every_tag_resolves_and_every_status_is_defined() {
        for e in ENTRIES {
            assert!(!e.tags().is_empty(), "{} cites no tag", e.name);
            for tag in e.tags() {
                assert!(source(tag).is_some(), "{}: tag [{tag}] has no source", e.name);
            }
            assert!(
                STATUSES.iter().any(|s| s.letter == e.status()),
                "{}: status {:?}",
                e.name,
                e.status()
            );
        }
        let cc = entry("cc_cores_per_chip").expect("in the table");
        assert_eq!((cc.tags(), cc.status()), (vec!["S3", "S17"], "C"));
        let link = entry("neuronlink_xy_link_bytes_per_s").expect("in the table");
        assert_eq!((link.tags(), link.status()), (vec!["P", "S5"], "D"));
        assert_eq!(source("[S3]").map(|s| s.title), Some("Trainium2 Architecture"));
        assert!(source("S43").is_none() && source("").is_none());
    }

    #[test]
    fn sources_are_well_formed() {
        for (i, s) in SOURCES.iter().enumerate() {
            assert!(!s.title.is_empty() && !s.read.is_empty(), "{}", s.tag);
            assert!(
                !s.title.contains('|') && !s.read.contains('|'),
                "{}: a '|' would break docs/sources.md's table",
                s.tag
            );
            // [P] is not public; [F] is this project's own calibration (docs/fidelity.md).
            assert_eq!(
                s.url.is_empty(),
                s.tag == "P" || s.tag == "F",
                "{}: only [P] and [F] have no public address",
                s.tag
            );
            for url in std::iter::once(&s.url).chain(s.also).filter(|u| !u.is_empty()) {
                assert!(url.starts_with("https://") && !url.contains(' '), "{}: {url}", s.tag);
            }
            if i < 42 {
                assert_eq!(s.tag, format!("S{}", i + 1), "S1..S42 in order");
            }
            assert!(SOURCES[..i].iter().all(|t| t.tag != s.tag), "{} twice", s.tag);
        }
        assert_eq!(SOURCES.len(), 44);
        let letters: Vec<_> = STATUSES.iter().map(|s| s.letter).collect();
        assert_eq!(letters, ["D", "I", "C", "calibrated"]);
    }

    #[test]
    fn entries_carry_the_constants() {
        let pe = entry("pe_clock_hz").expect("pe_clock_hz is in the table");
        assert_eq!(pe.value, PE_CLOCK_HZ);
        assert_eq!(pe.unit, "Hz");
        assert_eq!(pe.source, "[S1] D");
        assert_eq!(entry("sbuf_bytes").map(|e| e.value), Some(SBUF_BYTES as f64));
        assert_eq!(entry("cc_cores_per_chip").map(|e| e.value), Some(16.0));
        assert!(entry("PE_CLOCK_HZ").is_none());
    }
}
