//! The one integration-test binary of the core (one binary keeps link times down on 2 cores).

mod access_pattern;
mod cancel;
mod collectives;
mod distributed;
mod dma;
mod engine;
mod estimate_scale;
mod fuzz;
mod gemm_call;
mod machine;
mod numerics_exhaustive;
mod sparse_gemm;
mod sparsity;
