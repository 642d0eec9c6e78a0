//! The tensor engine's timing, kept apart from its values (architecture rule 1): nothing here
//! reads data, and nothing in the functional `engine` modules reads a clock.
//!
//! - [`instr`]: the cost of one instruction (`nc_matmul`, LoadStationary, a PSUM eviction).
//! - [`plan`]: a GEMM's tile plan ([`GemmPlan`]) and its evaluation into a [`crate::perf::Report`];
//!   `fast_forward` evaluates the plan's periodic parts in closed form, so a GEMM of any size is
//!   costed in milliseconds.
//! - [`split`]: a GEMM split over the physical cores of a Logical NeuronCore or a chip.
//! - [`throttle`]: the dI/dt throttle's ramp.

mod fast_forward;
pub mod instr;
pub mod plan;
pub mod split;
pub mod throttle;

#[doc(hidden)]
pub use plan::estimate_gemm_walk;
pub use plan::{estimate_gemm, GemmPlan, PeArrayClock};
#[doc(hidden)]
pub use split::estimate_gemm_cores_walk;
pub use split::{estimate_gemm_cores, Split};
pub use throttle::Throttle;
