//! The runtime's algorithm choice: which algorithm `auto` resolves to for a group of ranks, a
//! collective and a message size (the Neuron runtime's rule, docs/collectives.md).

use super::graph::hamiltonian_decomposition;
use super::ops::{Algorithm, Collective};
use super::schedule::{Group, MESH_MAX_RANKS};
use crate::spec::{COLLECTIVE_MESH_MAX_BYTES, COLLECTIVE_RDH_MAX_BYTES};

/// The algorithm `auto` picks for a group, collective and message size (`nccom-test`'s
/// `size(B)`): the Neuron runtime's rule (\[S16\]) of Mesh below 1 MB, RDH up to
/// 56 MB and KangaRing above, on the 4 x 4 torus of an instance; on the 3-D torus of an
/// UltraServer the torus rings stand in for KangaRing (which needs the 2-D torus); groups that
/// are not a whole torus use Ring for large messages, and RDH only with a power-of-two rank
/// count. Several UltraServers always go hierarchical. All-to-all and send/recv are direct.
pub fn auto_algorithm(group: &Group, collective: Collective, message_bytes: u64) -> Algorithm {
    let n = group.n();
    if matches!(collective, Collective::AllToAll | Collective::SendRecv) {
        return Algorithm::Mesh;
    }
    if group.is_whole() && group.torus.ultraservers() > 1 {
        return Algorithm::Hierarchical;
    }
    let shape = group.torus.torus_shape();
    if message_bytes < COLLECTIVE_MESH_MAX_BYTES && n <= MESH_MAX_RANKS {
        return Algorithm::Mesh;
    }
    if message_bytes <= COLLECTIVE_RDH_MAX_BYTES && n.is_power_of_two() {
        return Algorithm::Rdh;
    }
    if group.is_whole() {
        if hamiltonian_decomposition(shape).is_some() {
            return Algorithm::KangaRing;
        }
        if shape.iter().filter(|&&e| e >= 2).count() >= 2 {
            return Algorithm::Torus;
        }
    }
    Algorithm::Ring
}

/// The intra-UltraServer algorithm of a hierarchical schedule for a message of
/// `message_bytes`: the single-server rule of [`auto_algorithm`].
pub(super) fn intra_algorithm(shape: &[usize], p: usize, message_bytes: u64) -> Algorithm {
    if message_bytes < COLLECTIVE_MESH_MAX_BYTES && p <= MESH_MAX_RANKS {
        Algorithm::Mesh
    } else if message_bytes <= COLLECTIVE_RDH_MAX_BYTES && p.is_power_of_two() {
        Algorithm::Rdh
    } else if hamiltonian_decomposition(shape).is_some() {
        Algorithm::KangaRing
    } else if shape.iter().filter(|&&e| e >= 2).count() >= 2 {
        Algorithm::Torus
    } else {
        Algorithm::Ring
    }
}
