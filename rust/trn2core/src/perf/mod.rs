//! The [`Report`] every cost model returns (GEMM, DMA, collectives, the machine's timeline) and
//! its Chrome/Perfetto trace: the timing infrastructure shared by the `cost` modules of each
//! concept (`engine::cost`, `dma::cost`, `collective::cost`), which hold the models themselves.

pub mod report;

pub use report::{Event, Report, Uncertainty};
