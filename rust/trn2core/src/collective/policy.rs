//! The runtime's algorithm choice: which algorithm `auto` resolves to for a group of ranks, a
//! collective and a message size (the Neuron runtime's rule, docs/collectives.md).
//!
//! The runtime documents its message ranges (Mesh below 1 MB, RDH for 1-56 MB, KangaRing above)
//! for a whole trn2.48xlarge at LNC=2: 64 ranks. The model applies them to the chunk each rank
//! owns (`message / runtime ranks`), so the published 16-rank all-reduce (4 chips) switches at a
//! quarter of those sizes, as observed: KangaRing at 32 MiB (docs/fidelity.md).

use super::graph::hamiltonian_decomposition;
use super::ops::{Algorithm, Collective};
use super::schedule::{Group, MESH_MAX_RANKS};
use crate::spec::{COLLECTIVE_MESH_MAX_BYTES, COLLECTIVE_RANGES_RANKS, COLLECTIVE_RDH_MAX_BYTES};

/// Which documented range a message of `message_bytes` over `runtime_ranks` ranks falls in:
/// `Mesh` (below the Mesh range's end), `Rdh` (up to the RDH range's end) or `Ring` (above,
/// where the runtime uses KangaRing or a ring), comparing chunks per rank.
fn range(message_bytes: u64, runtime_ranks: usize) -> Algorithm {
    // message / ranks < limit / RANGES_RANKS, in exact integer arithmetic.
    let scaled = u128::from(message_bytes) * COLLECTIVE_RANGES_RANKS as u128;
    let ranks = runtime_ranks.max(1) as u128;
    if scaled < u128::from(COLLECTIVE_MESH_MAX_BYTES) * ranks {
        Algorithm::Mesh
    } else if scaled <= u128::from(COLLECTIVE_RDH_MAX_BYTES) * ranks {
        Algorithm::Rdh
    } else {
        Algorithm::Ring
    }
}

/// The algorithm `auto` picks for a group, collective and message size (`nccom-test`'s
/// `size(B)`): the runtime's ranges by chunk per rank (module doc): Mesh, then RDH (only with a
/// power-of-two chip count), then KangaRing: on a whole 4 x 4 instance its two Hamiltonian
/// cycles, on other chips of one instance or UltraServer the ring through them (the chips stand
/// for all their ranks, which KangaRing needs); on the 3-D torus of a whole UltraServer the
/// torus rings stand in for KangaRing, and a group spanning UltraServers without being all of
/// them uses a ring. Several whole UltraServers always go hierarchical. All-to-all and send/recv
/// are direct.
pub fn auto_algorithm(group: &Group, collective: Collective, message_bytes: u64) -> Algorithm {
    let n = group.n();
    if matches!(collective, Collective::AllToAll | Collective::SendRecv) {
        return Algorithm::Mesh;
    }
    if group.is_whole() && group.torus.ultraservers() > 1 {
        return Algorithm::Hierarchical;
    }
    let shape = group.torus.torus_shape();
    match range(message_bytes, group.runtime_ranks()) {
        Algorithm::Mesh if n <= MESH_MAX_RANKS => return Algorithm::Mesh,
        Algorithm::Mesh | Algorithm::Rdh if n.is_power_of_two() => return Algorithm::Rdh,
        _ => {}
    }
    if group.is_whole() {
        if hamiltonian_decomposition(shape).is_some() {
            return Algorithm::KangaRing;
        }
        if shape.iter().filter(|&&e| e >= 2).count() >= 2 {
            return Algorithm::Torus;
        }
        return Algorithm::Ring;
    }
    if group.torus.ultraservers() == 1 && n >= 2 {
        return Algorithm::KangaRing;
    }
    Algorithm::Ring
}

/// The intra-UltraServer algorithm of a hierarchical schedule for a message of
/// `message_bytes` over `p` chips of `ranks_per_chip` runtime ranks: the single-server rule of
/// [`auto_algorithm`].
pub(super) fn intra_algorithm(
    shape: &[usize], p: usize, ranks_per_chip: usize, message_bytes: u64,
) -> Algorithm {
    match range(message_bytes, p * ranks_per_chip) {
        Algorithm::Mesh if p <= MESH_MAX_RANKS => Algorithm::Mesh,
        Algorithm::Mesh | Algorithm::Rdh if p.is_power_of_two() => Algorithm::Rdh,
        _ if hamiltonian_decomposition(shape).is_some() => Algorithm::KangaRing,
        _ if shape.iter().filter(|&&e| e >= 2).count() >= 2 => Algorithm::Torus,
        _ => Algorithm::Ring,
    }
}
