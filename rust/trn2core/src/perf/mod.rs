//! The [`Report`] every cost model returns (GEMM, DMA, collectives, the machine's timeline) and
//! its Chrome/Perfetto trace: the timing infrastructure shared by the `cost` modules of each
//! concept (`engine::cost`, `dma::cost`, `collective::cost`), which hold the models themselves.

pub mod report;

pub(crate) use report::{
    write_bandwidth_counter, write_bandwidth_counter_drained, write_json_args,
};
pub use report::{Event, Report, Uncertainty, GEMM_PUBLISHED_KIND};
