//! # trn2core
//!
//! The pure-Rust core of trn2core, an emulator of the AWS Trainium2 chip (NeuronCore-v3) on an
//! ordinary CPU. It computes the exact bits the hardware would produce and, separately, how long
//! the hardware would take. It has no Python dependency: `cargo test -p trn2core` exercises all of
//! it; the `trn2core-py` crate only converts arrays and maps errors.
//!
//! Module map (see `docs/architecture.md`); values and time are kept apart: each concept holds
//! its functional model, and its timing model in a `cost` submodule that never reads data.
//! - [`spec`]: every hardware constant, once, with units and its source tag (docs/sources.md).
//! - [`names`]: the `named_enum!` macro, the one definition of every list of names.
//! - [`numerics`]: the number formats (FP8 e4m3/e5m2/e3m4/e4m3fn with configurable exponent bias,
//!   BF16, FP16, TF32, FP32), the six rounding modes including stochastic rounding, the
//!   counter-based random generator, and fast vectorised encode/decode kernels.
//! - [`dtype`]: the one table of element types (name, bits, kind, numpy dtype, format, machine
//!   type); `numerics::Format` and `machine::Dtype` each name part of it (a test keeps them in
//!   agreement), and Python builds its dtype maps from it.
//! - [`error`]: the one [`Error`] type.
//! - [`memory`]: HBM stacks, SBUF and PSUM as capacities (`CapacityError` before anything is
//!   reserved); a chip shares each HBM stack between two cores.
//! - [`engine`]: the tensor engine's bits (`nc_matmul`, the tiled GEMM, the zero-skipping sparse
//!   GEMM) and, in [`engine::cost`], its timing (instruction costs, the GEMM plan and its
//!   fast-forwarded evaluation, the multi-core split, the dI/dt throttle).
//! - [`sparsity`]: N:M pruning, compressed layouts, PyTorch's CUTLASS layout.
//! - [`dma`]: the inline-compression codecs and their checksummed stream; [`dma::cost`]: DMA
//!   queue timing.
//! - [`topology`]: chips and Logical NeuronCores, the torus (one NeuronCore is [`machine`]).
//! - [`collective`]: the five collectives as schedules, executed (bits) and costed (time).
//! - [`perf`]: the [`perf::Report`] every cost model returns, and its trace.
//! - [`machine`]: the whole NeuronCore (issue 14): SBUF/PSUM as byte memories, the four
//!   engines' instructions, and the engine-parallel timeline.
//! - [`cancel`]: cooperative cancellation of long calls (Ctrl-C); [`host`]: the host-memory
//!   check every user-sized allocation passes first; [`pool`]: the thread pool calls run on,
//!   started again in a forked child.

#![warn(missing_docs)]

#[macro_use]
pub mod names;

pub mod cancel;
pub mod collective;
pub mod dma;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod host;
pub mod machine;
pub mod memory;
pub mod numerics;
pub mod perf;
pub mod pool;
pub mod sparsity;
pub mod spec;
pub mod topology;
pub mod workload;

pub use error::{Error, Result};
pub use numerics::{Format, FormatInfo, Rounding};
