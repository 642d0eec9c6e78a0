//! One `nc_matmul` instruction: validation of its operands and the bits it writes to PSUM.
//!
//! `stationary` `[K, M]` and `moving` `[K, N]` give `stationary.T @ moving` `[M, N]`
//! (\[S2\]\[S9\]; docs/sources.md). In `double_row` the operands are `[128, 2, M]` and
//! `[128, 2, N]`: row `p` holds contraction elements `p` and `p + 128`, and the PE takes them in
//! that order, which is exactly the memory order of the `[128, 2]` leading dimensions
//! (\[S1\]\[S9\]).

use super::gemm;
use super::operand::check_len;
use super::operand::Reader;
use super::{PerfMode, CANONICAL_NAN};
use crate::numerics::Format;
use crate::{spec, Error, Result};

/// An `nc_matmul` operand: the exact float32 values of an array of `format` (already decoded,
/// e.g. by [`crate::numerics::decode`]), flattened in C order, and its shape.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    /// The values, `shape.iter().product()` of them.
    pub values: &'a [f32],
    /// `[K, M]` / `[K, N]`, or `[128, 2, M]` / `[128, 2, N]` in `double_row`.
    pub shape: &'a [usize],
    /// The number format the values came from (decides what the engine accepts).
    pub format: Format,
}

/// The part of the 128 x 128 PE array an `nc_matmul` uses (`tile_position`, `tile_size`):
/// `rows` bound the contraction (partitions), `columns` the stationary free size M.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeTile {
    /// `(start_row, start_column)`, multiples of the sizes.
    pub position: (usize, usize),
    /// `(rows, columns)`, each one of [`spec::PE_ROW_TILE_SIZES`].
    pub size: (usize, usize),
}

impl Default for PeTile {
    fn default() -> Self {
        PeTile::FULL
    }
}

impl PeTile {
    /// The whole array, the default.
    pub const FULL: PeTile = PeTile { position: (0, 0), size: (spec::PE_ROWS, spec::PE_COLS) };

    /// The tile of the contract's `tile_position` / `tile_size` arguments: both or neither
    /// (then the whole array).
    pub fn from_options(
        position: Option<(usize, usize)>, size: Option<(usize, usize)>,
    ) -> Result<PeTile> {
        let tile = match (position, size) {
            (None, None) => return Ok(PeTile::FULL),
            (Some(position), Some(size)) => PeTile { position, size },
            (Some(_), None) => {
                return Err(Error::value(
                    "tile_size",
                    "tile_position was given without tile_size; give both or neither",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::value(
                    "tile_position",
                    "tile_size was given without tile_position; give both or neither",
                ))
            }
        };
        tile.check()?;
        Ok(tile)
    }

    /// Sizes are PE tile sizes; starts are multiples of them and the tile lies in the array.
    pub fn check(&self) -> Result<()> {
        let axes = [
            ("row", self.position.0, self.size.0, spec::PE_ROWS),
            ("column", self.position.1, self.size.1, spec::PE_COLS),
        ];
        for (axis, start, size, extent) in axes {
            if !spec::PE_ROW_TILE_SIZES.contains(&size) {
                return Err(Error::value(
                    "tile_size",
                    format!(
                        "{axis} size {size} is not a PE tile size; expected one of {:?}",
                        spec::PE_ROW_TILE_SIZES
                    ),
                ));
            }
            if start % size != 0 || start + size > extent {
                return Err(Error::value(
                    "tile_position",
                    format!(
                        "{axis} start {start} must be a multiple of the {axis} size {size} \
                         with start + size <= {extent}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The validated geometry of one `nc_matmul`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulShape {
    /// Contraction length: K, or 256 in `double_row`.
    pub k: usize,
    /// Partitions (PE rows) the operands occupy: K, or 128 in `double_row`.
    pub partitions: usize,
    /// Stationary free size: the output's partitions.
    pub m: usize,
    /// Moving free size: the output's columns in the PSUM bank.
    pub n: usize,
    /// The mode.
    pub perf_mode: PerfMode,
}

fn is_fp32_family(f: Format) -> bool {
    matches!(f, Format::Fp32 | Format::Tf32)
}

fn check_formats(stationary: Format, moving: Format, perf_mode: PerfMode) -> Result<()> {
    check_format_pair(["stationary", "moving"], [stationary, moving], perf_mode)
}

/// The engine's rules for a pair of operand formats, errors naming the operands `names`
/// (`stationary`/`moving` of one instruction, `a`/`b` of a GEMM): no fp8_e4m3fn, fp32 and tf32
/// only with each other, `double_row` only fp8_e4m3/fp8_e5m2.
pub(crate) fn check_format_pair(
    names: [&str; 2], formats: [Format; 2], perf_mode: PerfMode,
) -> Result<()> {
    for (arg, f) in names.into_iter().zip(formats) {
        if f == Format::Fp8E4m3fn {
            return Err(Error::format(
                arg,
                "fp8_e4m3fn (OCP E4M3, max 448) is not supported by the Trainium2 tensor engine \
                 (NeuronCore-v3; it arrives with v4); use fp8_e4m3, Neuron's IEEE-style \
                 float8_e4m3 (max 240)",
            ));
        }
    }
    let [first, second] = formats;
    if is_fp32_family(first) != is_fp32_family(second) {
        let (arg, other, wide) = if is_fp32_family(first) {
            (names[1], second, first)
        } else {
            (names[0], first, second)
        };
        return Err(Error::format(
            arg,
            format!(
                "{} cannot pair with {}: fp32 and tf32 pair only with fp32 or tf32",
                other.name(),
                wide.name()
            ),
        ));
    }
    if perf_mode == PerfMode::DoubleRow {
        for (arg, f) in names.into_iter().zip(formats) {
            if !matches!(f, Format::Fp8E4m3 | Format::Fp8E5m2) {
                return Err(Error::format(
                    arg,
                    format!(
                        "perf_mode=\"double_row\" takes only fp8_e4m3 or fp8_e5m2 inputs; got {}",
                        f.name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `(partitions, free)` of an operand, checking its rank (and the `[128, 2, F]` layout).
fn operand_dims(
    arg: &str, shape: &[usize], free: &str, perf_mode: PerfMode,
) -> Result<(usize, usize)> {
    match perf_mode {
        PerfMode::None => match *shape {
            [k, f] => Ok((k, f)),
            _ => Err(Error::shape(
                arg,
                format!("expected a 2-D array [K, {free}], got shape {shape:?}"),
            )),
        },
        PerfMode::DoubleRow => {
            let rows = spec::MATMUL_CONTRACTION_MAX;
            let per_row = spec::MATMUL_DOUBLE_ROW_CONTRACTION_MAX / rows;
            match *shape {
                [p, two, f] if p == rows && two == per_row => Ok((p, f)),
                _ => Err(Error::shape(
                    arg,
                    format!(
                        "perf_mode=\"double_row\" expects a [{rows}, {per_row}, {free}] array, \
                         got shape {shape:?}"
                    ),
                )),
            }
        }
    }
}

/// Checks one `nc_matmul`'s operands against the engine's limits (contract section 2) and returns
/// its geometry. Errors name the argument, the value seen and the limit: `ShapeError` for shapes
/// (K <= 128, M <= 128, N <= 512, `double_row`'s `[128, 2, F]`, the PE tile), `FormatError` for
/// formats (fp8_e4m3fn, fp32/tf32 pairing, `double_row`'s fp8_e4m3/fp8_e5m2), `ValueError` for a
/// PE tile that `double_row` cannot use.
pub fn validate_matmul(
    stationary_shape: &[usize], stationary_format: Format, moving_shape: &[usize],
    moving_format: Format, perf_mode: PerfMode, tile: PeTile,
) -> Result<MatmulShape> {
    check_formats(stationary_format, moving_format, perf_mode)?;
    tile.check()?;
    if perf_mode == PerfMode::DoubleRow && tile != PeTile::FULL {
        return Err(Error::value(
            "tile_size",
            format!(
                "perf_mode=\"double_row\" uses the whole {} x {} PE array and cannot combine \
                 with PE tiling; got tile_size {:?}",
                spec::PE_ROWS,
                spec::PE_COLS,
                tile.size
            ),
        ));
    }
    let (k, m) = operand_dims("stationary", stationary_shape, "M", perf_mode)?;
    let (k_moving, n) = operand_dims("moving", moving_shape, "N", perf_mode)?;
    if k_moving != k {
        return Err(Error::shape(
            "moving",
            format!(
                "has K = {k_moving} partitions but stationary has K = {k}; the contraction runs \
                 over the partitions of both"
            ),
        ));
    }
    let limits = [
        ("stationary", "K", k, spec::MATMUL_CONTRACTION_MAX, "contraction (partitions)"),
        ("stationary", "M", m, spec::MATMUL_STATIONARY_FREE_MAX, "stationary free size"),
        (
            "moving",
            "N",
            n,
            spec::MATMUL_MOVING_FREE_MAX,
            "moving free size (one PSUM bank of fp32)",
        ),
    ];
    for (arg, name, value, max, what) in limits {
        if value == 0 {
            return Err(Error::shape(
                arg,
                format!("{name} = 0: an nc_matmul needs 1 <= {name} <= {max}"),
            ));
        }
        if value > max {
            return Err(Error::shape(
                arg,
                format!(
                    "{name} = {value} exceeds the tensor engine's {what} limit {name} <= {max}"
                ),
            ));
        }
    }
    if k > tile.size.0 {
        return Err(Error::shape(
            "stationary",
            format!("K = {k} partitions exceed the PE tile's {} rows (tile_size)", tile.size.0),
        ));
    }
    if m > tile.size.1 {
        return Err(Error::shape(
            "stationary",
            format!("M = {m} exceeds the PE tile's {} columns (tile_size)", tile.size.1),
        ));
    }
    let contraction = match perf_mode {
        PerfMode::None => k,
        PerfMode::DoubleRow => spec::MATMUL_DOUBLE_ROW_CONTRACTION_MAX,
    };
    Ok(MatmulShape { k: contraction, partitions: k, m, n, perf_mode })
}

/// [`validate_matmul`] plus the operands' value counts: everything [`matmul_into_validated`]
/// relies on. A caller that must look at the shape before writing PSUM (the `NeuronCore`'s
/// accumulate bookkeeping) validates once with this and then calls the `_validated` form.
pub fn validate_operands(
    stationary: &Operand, moving: &Operand, perf_mode: PerfMode, tile: PeTile,
) -> Result<MatmulShape> {
    let shape = validate_matmul(
        stationary.shape,
        stationary.format,
        moving.shape,
        moving.format,
        perf_mode,
        tile,
    )?;
    check_len("stationary", stationary.values.len(), stationary.shape)?;
    check_len("moving", moving.values.len(), moving.shape)?;
    Ok(shape)
}

/// The GEMM readers of one instruction's float32 operand values as they lie: `[K, M]` (the
/// driver's transposed `a`) and `[K, N]`.
pub(crate) fn operand_readers_t<'a>(
    stationary: &'a [f32], moving: &'a [f32], shape: MatmulShape,
) -> Result<(Reader<'a>, Reader<'a>)> {
    Ok((
        gemm::f32_reader("stationary", stationary, [shape.k, shape.m])?,
        gemm::f32_reader("moving", moving, [shape.k, shape.n])?,
    ))
}

/// The tile sums of one instruction into `out` (`m x n`, row-major).
fn compute(stationary: &[f32], moving: &[f32], shape: MatmulShape, out: &mut [f32]) -> Result<()> {
    // Both operands are [contraction, free] once the [128, 2] dimensions are flattened, and the
    // flattened order is the PE's product order, so the whole instruction is one K tile, its
    // stationary operand the driver's transposed `a` (as the machine's settle reads it).
    let (a, b) = operand_readers_t(stationary, moving, shape)?;
    let order: Vec<usize> = (0..shape.k).collect();
    let tile = gemm::KTile { a: &a, b: &b, k0: 0, order: &order, a_t: true };
    gemm::run_tiles(&[tile], shape.m, shape.n, true, out)
}

/// One `nc_matmul`: `stationary.T @ moving`, `[M, N]` row-major, as the instruction writes it to
/// PSUM with `accumulate=False` (the tile's sums, each started at +0.0 and taking the products
/// in the PE's order). See [`validate_matmul`] for the errors.
pub fn matmul(
    stationary: &Operand, moving: &Operand, perf_mode: PerfMode, tile: PeTile,
) -> Result<Vec<f32>> {
    let shape = validate_operands(stationary, moving, perf_mode, tile)?;
    let mut out = vec![0f32; shape.m * shape.n];
    compute(stationary.values, moving.values, shape, &mut out)?;
    Ok(out)
}

/// One `nc_matmul` into a PSUM region: row `i` of the result goes to
/// `psum[i * row_stride..][..N]`. With `accumulate` the tile's sums are added to what the region
/// holds (one fp32 rounding each), otherwise they overwrite it. Whether the region was written by
/// a matmul before (the contract's condition for `accumulate=True`) is the caller's to track.
pub fn matmul_into(
    psum: &mut [f32], row_stride: usize, stationary: &Operand, moving: &Operand,
    perf_mode: PerfMode, tile: PeTile, accumulate: bool,
) -> Result<MatmulShape> {
    let shape = validate_operands(stationary, moving, perf_mode, tile)?;
    matmul_into_validated(psum, row_stride, stationary, moving, shape, accumulate)?;
    Ok(shape)
}

/// [`matmul_into`] for operands already checked by [`validate_operands`] (which returned
/// `shape`); only the PSUM region is checked here.
pub fn matmul_into_validated(
    psum: &mut [f32], row_stride: usize, stationary: &Operand, moving: &Operand,
    shape: MatmulShape, accumulate: bool,
) -> Result<()> {
    let needed = (shape.m - 1).checked_mul(row_stride).and_then(|x| x.checked_add(shape.n));
    if row_stride < shape.n || needed.is_none_or(|need| need > psum.len()) {
        return Err(Error::shape(
            "psum",
            format!(
                "a region of {} rows x {} columns with row stride {row_stride} does not fit in \
                 {} elements",
                shape.m,
                shape.n,
                psum.len()
            ),
        ));
    }
    let mut sums = vec![0f32; shape.m * shape.n];
    compute(stationary.values, moving.values, shape, &mut sums)?;
    for (row, dst) in sums.chunks_exact(shape.n).zip(psum.chunks_mut(row_stride)) {
        for (d, &s) in dst.iter_mut().zip(row) {
            let v = if accumulate { *d + s } else { s };
            *d = if v.is_nan() { CANONICAL_NAN } else { v };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        st: &[usize], sf: Format, mv: &[usize], mf: Format, mode: PerfMode,
    ) -> Result<MatmulShape> {
        validate_matmul(st, sf, mv, mf, mode, PeTile::FULL)
    }

    #[test]
    fn limits_are_named() {
        let bf = Format::Bf16;
        let ok = check(&[128, 128], bf, &[128, 512], bf, PerfMode::None).expect("largest tile");
        assert_eq!((ok.k, ok.m, ok.n), (128, 128, 512));
        for (st, mv, needle) in [
            (&[129usize, 4][..], &[129usize, 4][..], "K <= 128"),
            (&[4, 129], &[4, 4], "M <= 128"),
            (&[4, 4], &[4, 513], "N <= 512"),
            (&[4, 4], &[5, 4], "K = 5"),
            (&[0, 4], &[0, 4], "K = 0"),
            (&[4, 4, 1], &[4, 4], "2-D"),
        ] {
            let err = check(st, bf, mv, bf, PerfMode::None).expect_err("over a limit");
            assert!(matches!(err, Error::Shape { .. }), "{err}");
            assert!(err.to_string().contains(needle), "{err} lacks {needle}");
        }
    }

    #[test]
    fn formats_are_checked() {
        let e4 = Format::Fp8E4m3;
        let err =
            check(&[4, 4], Format::Fp8E4m3fn, &[4, 4], e4, PerfMode::None).expect_err("e4m3fn");
        assert!(matches!(err, Error::Format { ref arg, .. } if arg == "stationary"));
        assert!(err.to_string().contains("fp8_e4m3, Neuron's"), "{err}");
        let err = check(&[4, 4], Format::Fp32, &[4, 4], Format::Bf16, PerfMode::None)
            .expect_err("fp32 with bf16");
        assert!(matches!(err, Error::Format { ref arg, .. } if arg == "moving"), "{err}");
        check(&[4, 4], Format::Fp32, &[4, 4], Format::Tf32, PerfMode::None).expect("fp32+tf32");
        check(&[4, 4], Format::Fp8E3m4, &[4, 4], Format::Bf16, PerfMode::None)
            .expect("mixed narrow formats");
        let dr = check(&[128, 2, 8], e4, &[128, 2, 16], Format::Fp8E5m2, PerfMode::DoubleRow)
            .expect("double_row");
        assert_eq!((dr.k, dr.partitions, dr.m, dr.n), (256, 128, 8, 16));
        let err = check(&[128, 2, 8], e4, &[128, 2, 8], Format::Bf16, PerfMode::DoubleRow)
            .expect_err("double_row bf16");
        assert!(err.to_string().contains("fp8_e4m3 or fp8_e5m2"), "{err}");
        let err = check(&[64, 2, 8], e4, &[64, 2, 8], e4, PerfMode::DoubleRow)
            .expect_err("double_row shape");
        assert!(err.to_string().contains("[128, 2, M]"), "{err}");
    }

    #[test]
    fn pe_tiles_are_checked() {
        let half = PeTile::from_options(Some((64, 0)), Some((64, 128))).expect("row tile");
        let bf = Format::Bf16;
        validate_matmul(&[64, 128], bf, &[64, 8], bf, PerfMode::None, half).expect("fits");
        let err = validate_matmul(&[65, 8], bf, &[65, 8], bf, PerfMode::None, half)
            .expect_err("K over the row tile");
        assert!(err.to_string().contains("64 rows"), "{err}");
        assert!(PeTile::from_options(Some((32, 0)), Some((64, 128))).is_err());
        assert!(PeTile::from_options(Some((0, 0)), Some((48, 128))).is_err());
        assert!(PeTile::from_options(Some((0, 0)), None).is_err());
        let e4 = Format::Fp8E4m3;
        let quarter_cols = PeTile::from_options(Some((0, 0)), Some((128, 32))).expect("valid");
        let err =
            validate_matmul(&[128, 2, 8], e4, &[128, 2, 8], e4, PerfMode::DoubleRow, quarter_cols)
                .expect_err("double_row with column tiling");
        assert!(err.to_string().contains("PE tiling"), "{err}");
    }
}
