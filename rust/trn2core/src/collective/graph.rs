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
            let part: Box<dyn Iterator<Item = &u32>> =
                if c % 2 == 0 { Box::new(lower.iter()) } else { Box::new(lower.iter().rev()) };
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
    let nbrs: Vec<Vec<usize>> = (0..n).map(|i| torus.neighbors(i).unwrap_or_default()).collect();
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

/// Two edge-disjoint Hamiltonian cycles through `layers` stacked copies of the 2-D torus
/// `shape` (the first `layers` instances of an UltraServer, one Z link between a chip and the
/// one above it): each copy of the instance's two cycles ([`hamiltonian_decomposition`]) is
/// cut at one link per neighbouring layer and the cut ends joined through the two Z links
/// there, so every cycle visits all `layers x X x Y` chips (index `layer x X x Y + x + X y`) on
/// direct links only, and the two cycles never share a link. `None` for fewer than two layers,
/// or a shape without a decomposition.
pub fn layered_hamiltonian_cycles(
    shape: &[usize], layers: usize,
) -> Option<[Vec<u32>; TORUS_HAMILTONIAN_CYCLES]> {
    if layers < 2 {
        return None;
    }
    let base = hamiltonian_decomposition(shape)?;
    let per = shape.iter().product::<usize>();
    let n = per * layers;
    let edge = |a: usize, b: usize| (a.min(b), a.max(b));
    // The cut of each cycle between layer l and l + 1: a link (positions in the layer) of the
    // cycle whose chips touch neither the cycle's other cuts nor the other cycle's cut there
    // (so no Z link is used twice).
    let mut cuts: Vec<Vec<(usize, usize)>> = Vec::new();
    for cyc in &base {
        let mut mine: Vec<(usize, usize)> = Vec::new();
        for l in 0..layers - 1 {
            let taken = |a: usize| {
                mine.iter().any(|&(u, v)| u == a || v == a)
                    || cuts.iter().any(|c| c[l].0 == a || c[l].1 == a)
            };
            let cut = (0..cyc.len())
                .map(|q| (cyc[q] as usize, cyc[(q + 1) % cyc.len()] as usize))
                .find(|&(u, v)| !taken(u) && !taken(v))?;
            mine.push(cut);
        }
        cuts.push(mine);
    }
    let mut out: Vec<Vec<u32>> = Vec::new();
    for (cyc, cut) in base.iter().zip(&cuts) {
        let cut_at = |l: usize, a: usize, b: usize| {
            (l > 0 && edge(cut[l - 1].0, cut[l - 1].1) == edge(a, b))
                || (l + 1 < layers && edge(cut[l].0, cut[l].1) == edge(a, b))
        };
        let mut adj: Vec<Vec<usize>> = vec![Vec::new(); n];
        for l in 0..layers {
            for q in 0..cyc.len() {
                let (a, b) = (cyc[q] as usize, cyc[(q + 1) % cyc.len()] as usize);
                if !cut_at(l, a, b) {
                    adj[l * per + a].push(l * per + b);
                    adj[l * per + b].push(l * per + a);
                }
            }
        }
        for (l, &(u, v)) in cut.iter().enumerate() {
            for p in [u, v] {
                adj[l * per + p].push((l + 1) * per + p);
                adj[(l + 1) * per + p].push(l * per + p);
            }
        }
        if adj.iter().any(|a| a.len() != 2) {
            return None;
        }
        out.push(cycle_from_0(&adj)?);
    }
    let second = out.pop()?;
    let first = out.pop()?;
    Some([first, second])
}

/// The edges of the torus not in `cycle`, as a cycle order from chip 0, if they form one
/// Hamiltonian cycle.
fn complement_cycle(nbrs: &[Vec<usize>], cycle: &[(usize, usize)]) -> Option<Vec<u32>> {
    let n = nbrs.len();
    let in_cycle = |a: usize, b: usize| cycle.contains(&(a.min(b), a.max(b)));
    let rest: Vec<Vec<usize>> =
        (0..n).map(|a| nbrs[a].iter().copied().filter(|&b| !in_cycle(a, b)).collect()).collect();
    if rest.iter().any(|r| r.len() != 2) {
        return None;
    }
    cycle_from_0(&rest)
}

/// Walks a 2-regular graph (`adj[a]`: the two neighbours of `a`) from chip 0: the order of one
/// cycle through all chips, or none.
fn cycle_from_0(adj: &[Vec<usize>]) -> Option<Vec<u32>> {
    let n = adj.len();
    let mut order = vec![0u32];
    let (mut prev, mut at) = (0usize, adj[0][0]);
    while at != 0 && order.len() <= n {
        order.push(at as u32);
        let nx = if adj[at][0] == prev { adj[at][1] } else { adj[at][0] };
        prev = at;
        at = nx;
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
    fn two_and_three_instances_of_an_ultraserver_carry_two_link_disjoint_cycles() {
        let t = Torus::ultraserver();
        for layers in [2usize, 3] {
            let [a, b] = layered_hamiltonian_cycles(&[4, 4], layers).expect("exists");
            let n = 16 * layers;
            let mut edges = Vec::new();
            for cyc in [&a, &b] {
                let mut sorted = cyc.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n as u32).collect::<Vec<u32>>());
                for q in 0..n {
                    let (x, y) = (cyc[q] as usize, cyc[(q + 1) % n] as usize);
                    assert_eq!(t.hops(x, y).expect("ok"), 1, "{layers} layers: {x}->{y}");
                    edges.push((x.min(y), x.max(y)));
                }
            }
            edges.sort();
            edges.dedup();
            assert_eq!(edges.len(), 2 * n, "{layers} layers: a link used twice");
        }
        assert!(layered_hamiltonian_cycles(&[4, 4], 1).is_none());
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
