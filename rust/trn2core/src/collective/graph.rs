//! Graph facts of the torus that the algorithms are built on: the boustrophedon (snake) ring
//! and the two edge-disjoint Hamiltonian cycles of a 2-D torus (KangaRing's rings).

use crate::spec::TORUS_HAMILTONIAN_CYCLES;
use crate::topology::Torus;

/// The boustrophedon order of a torus: consecutive chips are NeuronLink neighbours, and for
/// even extents the last chip neighbours the first, so it is a Hamiltonian cycle.
pub fn snake_order(shape: &[usize]) -> Vec<u32> {
    let mut order: Vec<u32> = vec![0];
    let mut stride = 1u32;
    for &e in shape {
        let lower = order.clone();
        order.clear();
        for c in 0..e as u32 {
            let part: Box<dyn Iterator<Item = &u32>> = if c % 2 == 0 {
                Box::new(lower.iter())
            } else {
                Box::new(lower.iter().rev())
            };
            order.extend(part.map(|&x| x + c * stride));
        }
        stride *= e as u32;
    }
    order
}

/// Two edge-disjoint Hamiltonian cycles covering every link of a 2-D torus (a Hamiltonian
/// decomposition, which every product of two cycles has), found by depth-first search in a fixed
/// neighbour order so the result is always the same. `None` if the torus is not 2-D with both
/// extents at least 3, or no decomposition turns up within the search budget.
pub fn hamiltonian_decomposition(shape: &[usize]) -> Option<[Vec<u32>; TORUS_HAMILTONIAN_CYCLES]> {
    if shape.len() != 2 || shape[0] < 3 || shape[1] < 3 {
        return None;
    }
    let torus = Torus::new(shape, 1).ok()?;
    let n = torus.size();
    let nbrs: Vec<Vec<usize>> = (0..n)
        .map(|i| torus.neighbors(i).unwrap_or_default())
        .collect();
    let edge = |a: usize, b: usize| (a.min(b), a.max(b));
    let mut path = vec![0usize];
    let mut used = vec![false; n];
    used[0] = true;
    let mut budget: u64 = 5_000_000;
    // Iterative DFS over Hamiltonian cycles from chip 0; each complete cycle is tested for a
    // connected complement.
    let mut next_idx = vec![0usize; n + 1];
    loop {
        if budget == 0 {
            return None;
        }
        budget -= 1;
        let depth = path.len();
        let at = path[depth - 1];
        if depth == n {
            if nbrs[at].contains(&0) {
                let mut cyc_edges: Vec<(usize, usize)> =
                    path.windows(2).map(|w| edge(w[0], w[1])).collect();
                cyc_edges.push(edge(at, 0));
                if let Some(other) = complement_cycle(&nbrs, &cyc_edges) {
                    let first: Vec<u32> = path.iter().map(|&c| c as u32).collect();
                    return Some([first, other]);
                }
            }
            // Backtrack.
            used[at] = false;
            path.pop();
            continue;
        }
        let i = next_idx[depth];
        if i < nbrs[at].len() {
            next_idx[depth] += 1;
            let nb = nbrs[at][i];
            if !used[nb] {
                used[nb] = true;
                path.push(nb);
                next_idx[depth + 1] = 0;
            }
        } else {
            if depth == 1 {
                return None;
            }
            used[at] = false;
            path.pop();
        }
    }
}

/// The edges of the torus not in `cycle`, as a cycle order from chip 0, if they form one
/// Hamiltonian cycle.
fn complement_cycle(nbrs: &[Vec<usize>], cycle: &[(usize, usize)]) -> Option<Vec<u32>> {
    let n = nbrs.len();
    let in_cycle = |a: usize, b: usize| cycle.contains(&(a.min(b), a.max(b)));
    let rest: Vec<Vec<usize>> = (0..n)
        .map(|a| {
            nbrs[a]
                .iter()
                .copied()
                .filter(|&b| !in_cycle(a, b))
                .collect()
        })
        .collect();
    if rest.iter().any(|r| r.len() != 2) {
        return None;
    }
    let mut order = vec![0u32];
    let (mut prev, mut at) = (0usize, rest[0][0]);
    while at != 0 {
        order.push(at as u32);
        let nx = if rest[at][0] == prev {
            rest[at][1]
        } else {
            rest[at][0]
        };
        prev = at;
        at = nx;
        if order.len() > n {
            return None;
        }
    }
    (order.len() == n).then_some(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_is_a_cycle_of_neighbours() {
        for shape in [vec![4, 4], vec![4, 4, 4]] {
            let t = Torus::new(&shape, 1).expect("valid");
            let o = snake_order(&shape);
            assert_eq!(o.len(), t.size());
            for q in 0..o.len() {
                let (a, b) = (o[q] as usize, o[(q + 1) % o.len()] as usize);
                assert_eq!(t.hops(a, b).expect("ok"), 1, "{shape:?} {a}->{b}");
            }
        }
    }

    #[test]
    fn the_4x4_torus_splits_into_two_hamiltonian_cycles() {
        let t = Torus::instance();
        let [a, b] = hamiltonian_decomposition(&[4, 4]).expect("exists");
        let mut edges = Vec::new();
        for cyc in [&a, &b] {
            assert_eq!(cyc.len(), 16);
            let mut sorted = cyc.clone();
            sorted.sort();
            assert_eq!(sorted, (0..16).collect::<Vec<u32>>());
            for q in 0..16 {
                let (x, y) = (cyc[q] as usize, cyc[(q + 1) % 16] as usize);
                assert_eq!(t.hops(x, y).expect("ok"), 1);
                edges.push((x.min(y), x.max(y)));
            }
        }
        edges.sort();
        edges.dedup();
        assert_eq!(edges.len(), 32, "every link used exactly once");
    }
}
