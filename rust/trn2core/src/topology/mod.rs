//! The hardware objects above one NeuronCore (which is [`crate::machine::Machine`]): the chip
//! and its Logical NeuronCores (`chip`), the NeuronLink torus of instances and
//! UltraServers joined by EFA ([`Torus`]), and the collectives over them ([`crate::collective`]).

mod chip;
mod torus;

pub use self::chip::{
    check_lnc, die_of, hbm_stack_of, instance_type, logical_core_members, logical_cores_per_chip,
    InstanceType, LogicalCoreInfo, INSTANCE_TYPES,
};
pub use self::torus::{
    LinkKind, RouteInfo, Torus, DIM_NAMES, MAX_TORUS_DIMS, MAX_TORUS_EXTENT, MAX_ULTRASERVERS,
};
