//! One physical NeuronCore-v3: PSUM state (128 partitions x 8 banks x 2 KiB of fp32) and the
//! tensor engine's clock for instructions issued one at a time.

use crate::engine::cost::instr::matmul_cycles;
use crate::engine::cost::PeArrayClock;
use crate::engine::{self, MatmulShape, Operand, PeTile, PerfMode};
use crate::numerics::{decode_into, CodesRef, Format};
use crate::perf::Report;
use crate::spec::{
    CORE_PEAK_BF16_FLOPS_PER_S, PE_CLOCK_HZ, PSUM_BANKS, PSUM_BANK_FP32_ELEMENTS, PSUM_PARTITIONS,
};
use crate::{Error, Result};

/// PSUM: `[partition][bank][element]` fp32, and which elements a matmul has written.
#[derive(Debug, Clone)]
pub struct Psum {
    data: Vec<f32>,
    written: Vec<bool>,
}

impl Default for Psum {
    fn default() -> Self {
        let n = PSUM_PARTITIONS * PSUM_BANKS * PSUM_BANK_FP32_ELEMENTS;
        Psum {
            data: vec![0.0; n],
            written: vec![false; n],
        }
    }
}

impl Psum {
    /// Elements between consecutive partitions.
    pub const ROW_STRIDE: usize = PSUM_BANKS * PSUM_BANK_FP32_ELEMENTS;

    fn offset(partition: usize, bank: usize) -> usize {
        (partition * PSUM_BANKS + bank) * PSUM_BANK_FP32_ELEMENTS
    }

    /// Checks a bank number.
    pub fn check_bank(bank: usize) -> Result<()> {
        if bank >= PSUM_BANKS {
            return Err(Error::value(
                "bank",
                format!("got {bank}; PSUM has banks 0..{PSUM_BANKS}"),
            ));
        }
        Ok(())
    }

    /// Reads `rows` partitions x `cols` fp32 elements of `bank`, row-major.
    pub fn read(&self, bank: usize, rows: usize, cols: usize) -> Result<Vec<f32>> {
        Psum::check_bank(bank)?;
        if rows == 0 || rows > PSUM_PARTITIONS {
            return Err(Error::shape(
                "rows",
                format!("got {rows}; PSUM has 1..={PSUM_PARTITIONS} partitions"),
            ));
        }
        if cols == 0 || cols > PSUM_BANK_FP32_ELEMENTS {
            return Err(Error::shape(
                "cols",
                format!("got {cols}; a PSUM bank holds 1..={PSUM_BANK_FP32_ELEMENTS} fp32 per partition"),
            ));
        }
        let mut out = Vec::with_capacity(rows * cols);
        for p in 0..rows {
            let o = Psum::offset(p, bank);
            out.extend_from_slice(&self.data[o..o + cols]);
        }
        Ok(out)
    }
}

/// One physical NeuronCore-v3.
#[derive(Debug, Clone, Default)]
pub struct NeuronCore {
    /// Index of the core on its chip (0..8).
    pub index: usize,
    psum: Psum,
    clock: PeArrayClock,
    flops: f64,
}

impl NeuronCore {
    /// A core with empty PSUM and an idle tensor engine.
    pub fn new(index: usize) -> Self {
        NeuronCore {
            index,
            ..NeuronCore::default()
        }
    }

    /// The PSUM contents.
    pub fn psum(&self) -> &Psum {
        &self.psum
    }

    /// One `nc_matmul`: computes `stationary.T @ moving`, writes (or with `accumulate` adds) it
    /// to PSUM `bank` at the output partitions of the PE tile's columns, costs it on the PE
    /// array, and returns the region's new contents `[M, N]`.
    ///
    /// Errors: the engine's shape and format limits; `accumulate=True` onto a region that no
    /// matmul wrote (undefined on the hardware, \[S2\]\[S9\]).
    pub fn matmul(
        &mut self,
        stationary: &Operand,
        moving: &Operand,
        bank: usize,
        accumulate: bool,
        perf_mode: PerfMode,
        tile: PeTile,
    ) -> Result<Vec<f32>> {
        Psum::check_bank(bank)?;
        let shape: MatmulShape = engine::validate_operands(stationary, moving, perf_mode, tile)?;
        let p0 = tile.position.1;
        if p0 + shape.m > PSUM_PARTITIONS {
            return Err(Error::shape(
                "tile_position",
                format!(
                    "output partitions {p0}..{} exceed PSUM's {PSUM_PARTITIONS}",
                    p0 + shape.m
                ),
            ));
        }
        if accumulate {
            for p in p0..p0 + shape.m {
                let o = Psum::offset(p, bank);
                if let Some(e) = self.psum.written[o..o + shape.n].iter().position(|w| !w) {
                    return Err(Error::value(
                        "accumulate",
                        format!(
                            "PSUM bank {bank}, partition {p}, element {e} was not written by a matmul; \
                             the first matmul of an accumulation group needs accumulate=False"
                        ),
                    ));
                }
            }
        }
        let base = Psum::offset(p0, bank);
        engine::matmul_into_validated(
            &mut self.psum.data[base..],
            Psum::ROW_STRIDE,
            stationary,
            moving,
            shape,
            accumulate,
        )?;
        let mut out = Vec::with_capacity(shape.m * shape.n);
        for p in p0..p0 + shape.m {
            let o = Psum::offset(p, bank);
            self.psum.written[o..o + shape.n]
                .iter_mut()
                .for_each(|w| *w = true);
            out.extend_from_slice(&self.psum.data[o..o + shape.n]);
        }
        let fp32 = stationary.format == Format::Fp32 || moving.format == Format::Fp32;
        let cycles = matmul_cycles(shape.m, shape.n, fp32);
        let (r0, rows) = (tile.position.0, tile.size.0);
        let (c0, cols) = (tile.position.1, tile.size.1);
        self.clock.issue(r0, rows, c0, cols, cycles);
        self.flops += 2.0 * (shape.k * shape.m * shape.n) as f64;
        Ok(out)
    }

    /// [`Self::matmul`] on operands given as raw codes of their formats (what the binding
    /// passes: one crossing, no decode round trip through Python): each is widened exactly to
    /// fp32 first (fp32 and tf32 operands are float32 containers, read as they are).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_codes(
        &mut self,
        stationary: (CodesRef, &[usize], Format),
        moving: (CodesRef, &[usize], Format),
        bank: usize,
        accumulate: bool,
        perf_mode: PerfMode,
        tile: PeTile,
    ) -> Result<Vec<f32>> {
        let sv = widen("stationary", stationary.0, stationary.2)?;
        let mv = widen("moving", moving.0, moving.2)?;
        let st = Operand {
            values: &sv,
            shape: stationary.1,
            format: stationary.2,
        };
        let mo = Operand {
            values: &mv,
            shape: moving.1,
            format: moving.2,
        };
        self.matmul(&st, &mo, bank, accumulate, perf_mode, tile)
    }

    /// [`Self::transpose`] on `stationary` given as raw codes of `format`.
    pub fn transpose_codes(
        &mut self,
        stationary: CodesRef,
        k: usize,
        m: usize,
        format: Format,
        bank: usize,
    ) -> Result<()> {
        let values = widen("stationary", stationary, format)?;
        self.transpose(&values, k, m, format, bank)
    }

    /// Transpose mode (`nc_matmul(..., is_transpose=True)`, NCv3; \[S1\]\[S9\]): the PE
    /// array passes `stationary` `[K, M]` through unchanged to PSUM `bank` as `[M, K]`, bit for
    /// bit (NaN and Inf included, unlike a matmul with an identity). `values` are the exact
    /// float32 values of a `format` array; PSUM keeps them as such (the hardware writes 16-bit
    /// elements for 16-bit inputs; the facade returns the input's own dtype). The region is not
    /// an accumulation group: a later `accumulate=True` onto it is refused.
    ///
    /// Cost: `max(K, min(64, M))` PE cycles (\[S10\] `nc_transpose` on the PE), x2 for fp32
    /// ("2x faster FP32 transpose vs non-transpose mode", \[S1\]).
    pub fn transpose(
        &mut self,
        values: &[f32],
        k: usize,
        m: usize,
        format: Format,
        bank: usize,
    ) -> Result<()> {
        Psum::check_bank(bank)?;
        if format == Format::Fp8E4m3fn {
            return Err(Error::format(
                "stationary",
                "fp8_e4m3fn is not supported by the Trainium2 tensor engine; use fp8_e4m3",
            ));
        }
        if k == 0 || k > PSUM_PARTITIONS || m == 0 || m > PSUM_PARTITIONS {
            return Err(Error::shape(
                "stationary",
                format!("transpose mode takes [K, M] with 1 <= K, M <= 128, got [{k}, {m}]"),
            ));
        }
        if values.len() != k * m {
            return Err(Error::shape(
                "stationary",
                format!("expected {} values, got {}", k * m, values.len()),
            ));
        }
        for p in 0..m {
            let o = Psum::offset(p, bank);
            for (j, dst) in self.psum.data[o..o + k].iter_mut().enumerate() {
                *dst = values[j * m + p];
            }
            self.psum.written[o..o + k]
                .iter_mut()
                .for_each(|w| *w = false);
        }
        let factor = if format == Format::Fp32 { 2 } else { 1 };
        let cycles = (k.max(m.min(crate::spec::MM_INIT_LATENCY_CYCLES)) * factor) as u64;
        self.clock.issue(0, k, 0, m, cycles);
        Ok(())
    }

    /// Reads PSUM (see [`Psum::read`]).
    pub fn read_psum(&self, bank: usize, rows: usize, cols: usize) -> Result<Vec<f32>> {
        self.psum.read(bank, rows, cols)
    }

    /// Timing of the instructions issued so far (no throttle: single instructions are costed at
    /// the engine's steady-state rate; matmuls on disjoint PE tiles overlap).
    pub fn report(&self) -> Report {
        let mut r = Report::new("matmul");
        r.description = format!(
            "{} nc_matmul instructions on NeuronCore {}",
            self.clock.instructions, self.index
        );
        r.instructions = self.clock.instructions;
        r.pe_cycles = self.clock.pe_cycles;
        r.cycles = self.clock.end_cycles;
        r.seconds = self.clock.end_cycles / PE_CLOCK_HZ;
        r.flops = self.flops;
        if r.seconds > 0.0 {
            r.tflops = r.flops / r.seconds / 1e12;
            r.pe_tflops = r.flops / (r.pe_cycles as f64 / PE_CLOCK_HZ) / 1e12;
            r.utilization = (r.flops / r.seconds / CORE_PEAK_BF16_FLOPS_PER_S).min(1.0);
        }
        r.peak_tflops = CORE_PEAK_BF16_FLOPS_PER_S / 1e12;
        r
    }
}

/// The exact fp32 values of `codes` of `format` (`arg` names the operand in errors); a tf32
/// operand is a float32 container and is read as is, as the engine reads it.
fn widen(arg: &str, codes: CodesRef, format: Format) -> Result<Vec<f32>> {
    let len = match codes {
        CodesRef::U8(c) => c.len(),
        CodesRef::U16(c) => c.len(),
        CodesRef::U32(c) => c.len(),
    };
    let read_as = if format == Format::Tf32 {
        Format::Fp32
    } else {
        format
    };
    let mut out = vec![0f32; len];
    decode_into(codes, &read_as.encoding(), &mut out).map_err(|e| match e {
        Error::Format { message, .. } => Error::format(arg, message),
        other => other,
    })?;
    Ok(out)
}
