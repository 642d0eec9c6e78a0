//! The hardware objects: a physical [`NeuronCore`] with its PSUM and tensor-engine clock (later:
//! logical cores, chips, instances and the torus).

mod core;

pub use self::core::{NeuronCore, Psum};
