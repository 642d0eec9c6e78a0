//! The timing model, kept apart from the numbers (architecture rule 1): instruction costs,
//! the GEMM schedule walk, the dI/dt throttle, and the [`Report`] with its Perfetto trace.
//!
//! Nothing here looks at data: [`tensor::estimate_gemm`] walks the same tile schedule that the
//! functional GEMM executes, so a 16384^3 GEMM is costed in milliseconds.

pub mod dma;
pub mod report;
pub mod split;
pub mod tensor;
pub mod throttle;

pub use report::{Event, Report};
pub use split::{estimate_gemm_cores, Split};
pub use tensor::{estimate_gemm, matmul_cycles, GemmPlan, PeArrayClock};
pub use throttle::Throttle;
