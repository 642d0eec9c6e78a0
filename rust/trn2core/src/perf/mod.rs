//! The timing model, kept apart from the numbers (architecture rule 1): instruction costs,
//! the GEMM schedule walk, the dI/dt throttle, and the [`Report`] with its Perfetto trace.
//!
//! Nothing here looks at data: [`tensor::estimate_gemm`] evaluates the same tile schedule that
//! the functional GEMM executes, fast-forwarding its periodic parts (`schedule`), so a GEMM of
//! any size is costed in milliseconds.

pub mod dma;
pub mod report;
mod schedule;
pub mod split;
pub mod tensor;
pub mod throttle;

pub use report::{Event, Report};
#[doc(hidden)]
pub use split::estimate_gemm_cores_walk;
pub use split::{estimate_gemm_cores, Split};
#[doc(hidden)]
pub use tensor::estimate_gemm_walk;
pub use tensor::{estimate_gemm, matmul_cycles, GemmPlan, PeArrayClock};
pub use throttle::Throttle;
