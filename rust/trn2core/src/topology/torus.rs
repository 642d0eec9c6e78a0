//! The torus of NeuronLink-connected chips, and UltraServers joined by EFA (\[S5\]\[S15\]\[S16\]).
//!
//! A trn2.48xlarge (or trn2u.48xlarge) holds 16 chips in a 4 x 4 2-D torus: every chip links to
//! its X and Y neighbours, with wraparound. A Trn2 UltraServer joins four trn2u.48xlarge along a
//! Z ring, giving a 4 x 4 x 4 3-D torus of 64 chips. An UltraCluster joins UltraServers through
//! EFA: every chip has its own 200 Gbps NIC, and the network between NICs is modelled as a
//! non-blocking switched fabric (no public source describes its topology), so a cross-server
//! transfer uses the sender's NIC egress and the receiver's NIC ingress and nothing else.
//!
//! # Numbering
//!
//! Chip `i` of a torus of extents `(X, Y, Z)` has coordinates `(x, y, z)` with
//! `i = x + X * (y + Y * z)`: x varies fastest. In an UltraCluster the UltraServer index `s` is
//! one more, slowest coordinate: `i = s * 64 + local`.
//!
//! # Links
//!
//! Each chip has, per torus dimension of extent above 1, a link towards `+1` and one towards `-1`
//! (wraparound). Links are full duplex; the bandwidth is per direction: X and Y 128 GB/s, Z 64 GB/s
//! (`spec`). In this module a *link* is one direction of one cable, identified by the chip it
//! leaves and its direction; the EFA NIC of a chip counts as two more: egress and ingress.
//!
//! # Routing
//!
//! NeuronLink routes a transfer between chips that are not neighbours through intermediate chips
//! automatically (D, \[S16\]); the routing algorithm is undocumented. We use
//! dimension-order routing, X then Y then Z, each dimension the short way round the ring, a tie
//! (distance exactly half the ring) going the `+` way.

use crate::spec::{
    EFA_CHIP_BYTES_PER_S, INSTANCE_TORUS_X, INSTANCE_TORUS_Y, NEURONLINK_XY_LINK_BYTES_PER_S,
    NEURONLINK_Z_LINK_BYTES_PER_S, ULTRASERVER_TORUS_Z,
};
use crate::{Error, Result};

/// Most torus dimensions a Trn2 machine has (X, Y, Z).
pub const MAX_TORUS_DIMS: usize = 3;

/// Most UltraServers an [`Torus`] may join (a host-side limit of this model, not a hardware
/// number: 4,096 UltraServers are 262,144 chips, far beyond any announced UltraCluster).
pub const MAX_ULTRASERVERS: usize = 4096;

/// Largest extent of one torus dimension this model accepts (a host-side limit).
pub const MAX_TORUS_EXTENT: usize = 64;

/// Names of the torus dimensions.
pub const DIM_NAMES: [&str; MAX_TORUS_DIMS] = ["X", "Y", "Z"];

/// One direction of one link, as the cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkKind {
    /// The NeuronLink leaving a chip along `dim` towards `+1` (`plus`) or `-1`.
    NeuronLink {
        /// The torus dimension: 0 = X, 1 = Y (within an instance), 2 = Z (between the
        /// instances of an UltraServer); see [`DIM_NAMES`].
        dim: usize,
        /// Towards the `+1` neighbour (wrapping around the torus), else towards `-1`.
        plus: bool,
    },
    /// The chip's EFA NIC, sending.
    EfaEgress,
    /// The chip's EFA NIC, receiving.
    EfaIngress,
}

/// A torus of chips (`shape`, possibly empty for one chip), replicated `ultraservers` times and the
/// copies joined by EFA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torus {
    shape: Vec<usize>,
    ultraservers: usize,
    per_server: usize,
}

/// How a transfer travels: NeuronLink hops, or one EFA crossing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteInfo {
    /// NeuronLink hops (0 for a transfer to the same chip or across EFA).
    pub hops: usize,
    /// Whether the transfer crosses EFA (between UltraServers).
    pub efa: bool,
}

impl Torus {
    /// A torus of `shape` (extents along X, Y, Z; each `1..=64`; at most 3 dimensions; an empty
    /// shape is one chip), `ultraservers` copies of it joined by EFA (`1..=4096`).
    pub fn new(shape: &[usize], ultraservers: usize) -> Result<Torus> {
        if shape.len() > MAX_TORUS_DIMS {
            return Err(Error::shape(
                "shape",
                format!(
                    "{shape:?} has {} dimensions; Trn2 tori have at most {MAX_TORUS_DIMS} (X, Y, Z)",
                    shape.len()
                ),
            ));
        }
        if let Some(&bad) = shape.iter().find(|&&e| e == 0 || e > MAX_TORUS_EXTENT) {
            return Err(Error::shape(
                "shape",
                format!("extent {bad} in {shape:?} is outside 1..={MAX_TORUS_EXTENT}"),
            ));
        }
        if ultraservers == 0 || ultraservers > MAX_ULTRASERVERS {
            return Err(Error::value(
                "n_ultraservers",
                format!("got {ultraservers}; expected 1..={MAX_ULTRASERVERS}"),
            ));
        }
        let per_server = shape.iter().product::<usize>();
        Ok(Torus { shape: shape.to_vec(), ultraservers, per_server })
    }

    /// One chip (a trn2.3xlarge): no links.
    pub fn single_chip() -> Torus {
        Torus { shape: Vec::new(), ultraservers: 1, per_server: 1 }
    }

    /// The 4 x 4 2-D torus of a trn2.48xlarge / trn2u.48xlarge.
    pub fn instance() -> Torus {
        Torus {
            shape: vec![INSTANCE_TORUS_X, INSTANCE_TORUS_Y],
            ultraservers: 1,
            per_server: INSTANCE_TORUS_X * INSTANCE_TORUS_Y,
        }
    }

    /// The 4 x 4 x 4 3-D torus of a Trn2 UltraServer (64 chips).
    pub fn ultraserver() -> Torus {
        let shape = vec![INSTANCE_TORUS_X, INSTANCE_TORUS_Y, ULTRASERVER_TORUS_Z];
        let per_server = shape.iter().product();
        Torus { shape, ultraservers: 1, per_server }
    }

    /// `n` UltraServers joined by EFA.
    pub fn ultracluster(n: usize) -> Result<Torus> {
        Torus::new(&Torus::ultraserver().shape, n)
    }

    /// Extents of the NeuronLink torus of one server (empty for one chip).
    pub fn torus_shape(&self) -> &[usize] {
        &self.shape
    }

    /// Servers (UltraServers) joined by EFA.
    pub fn ultraservers(&self) -> usize {
        self.ultraservers
    }

    /// Chips per server.
    pub fn chips_per_server(&self) -> usize {
        self.per_server
    }

    /// Chips in total.
    pub fn size(&self) -> usize {
        self.per_server * self.ultraservers
    }

    /// The full shape: the torus extents, and the number of ultraservers last when there is more
    /// than one.
    pub fn shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        if self.ultraservers > 1 {
            s.push(self.ultraservers);
        }
        s
    }

    fn check(&self, arg: &str, i: usize) -> Result<()> {
        if i >= self.size() {
            return Err(Error::value(
                arg,
                format!("chip {i} does not exist; this torus has chips 0..{}", self.size()),
            ));
        }
        Ok(())
    }

    /// Coordinates of chip `i` (see the module doc for the order).
    pub fn coords(&self, i: usize) -> Result<Vec<usize>> {
        self.check("i", i)?;
        Ok(self.coords_unchecked(i))
    }

    fn coords_unchecked(&self, i: usize) -> Vec<usize> {
        let mut rest = i % self.per_server;
        let mut c = Vec::with_capacity(self.shape.len() + 1);
        for &e in &self.shape {
            c.push(rest % e);
            rest /= e;
        }
        if self.ultraservers > 1 {
            c.push(i / self.per_server);
        }
        c
    }

    /// The chip at `coords`.
    pub fn index(&self, coords: &[usize]) -> Result<usize> {
        let shape = self.shape();
        if coords.len() != shape.len() {
            return Err(Error::shape(
                "coords",
                format!(
                    "{coords:?} has {} coordinates; this torus has shape {shape:?}",
                    coords.len()
                ),
            ));
        }
        let mut i = 0;
        for (k, (&c, &e)) in coords.iter().zip(&shape).enumerate().rev() {
            if c >= e {
                return Err(Error::value(
                    "coords",
                    format!("coordinate {k} of {coords:?} is {c}; the extent is {e}"),
                ));
            }
            i = i * e + c;
        }
        Ok(i)
    }

    /// The chip one step from `i` along `dim` towards `+1` or `-1` (wrapping), same server.
    fn step(&self, i: usize, dim: usize, plus: bool) -> usize {
        let e = self.shape[dim];
        let stride: usize = self.shape[..dim].iter().product();
        let c = (i / stride) % e;
        let nc = if plus { (c + 1) % e } else { (c + e - 1) % e };
        i - c * stride + nc * stride
    }

    /// NeuronLink neighbours of chip `i`, in the order X+, X-, Y+, Y-, Z+, Z- (each chip once).
    pub fn neighbors(&self, i: usize) -> Result<Vec<usize>> {
        self.check("i", i)?;
        let mut out = Vec::new();
        for dim in 0..self.shape.len() {
            if self.shape[dim] < 2 {
                continue;
            }
            for plus in [true, false] {
                let j = self.step(i, dim, plus);
                if !out.contains(&j) {
                    out.push(j);
                }
            }
        }
        Ok(out)
    }

    /// Shortest displacement along a ring of `e` from coordinate `a` to `b`, and whether it
    /// goes `+` (a tie goes `+` from an even `a`, `-` from an odd one).
    fn displacement(e: usize, a: usize, b: usize) -> (usize, bool) {
        let fwd = (b + e - a) % e;
        let back = (a + e - b) % e;
        if fwd < back || (fwd == back && a.is_multiple_of(2)) {
            (fwd, true)
        } else {
            (back, false)
        }
    }

    /// NeuronLink hops between chips of one server, or 1 for chips of different ultraservers (one
    /// crossing of the EFA network); 0 from a chip to itself.
    pub fn hops(&self, i: usize, j: usize) -> Result<usize> {
        self.check("i", i)?;
        self.check("j", j)?;
        let r = self.route(i, j, |_| {});
        Ok(if r.efa { 1 } else { r.hops })
    }

    /// Bandwidth per direction of the link between chips `i` and `j`: X/Y NeuronLink 128 GB/s,
    /// Z 64 GB/s, EFA 25 GB/s (the chip's 200 Gbps NIC) between ultraservers.
    ///
    /// Errors: the chips are the same, or in one server but not neighbours.
    pub fn link_bandwidth(&self, i: usize, j: usize) -> Result<f64> {
        self.check("i", i)?;
        self.check("j", j)?;
        if i / self.per_server != j / self.per_server {
            return Ok(EFA_CHIP_BYTES_PER_S);
        }
        if i != j {
            for dim in 0..self.shape.len() {
                if self.shape[dim] >= 2
                    && (self.step(i, dim, true) == j || self.step(i, dim, false) == j)
                {
                    return Ok(Torus::dim_bandwidth(dim));
                }
            }
        }
        let hops = self.route(i, j, |_| {}).hops;
        Err(Error::value(
            "j",
            format!(
                "chips {i} and {j} are not directly linked ({hops} NeuronLink hops apart); \
                 NeuronLink routes such transfers through intermediate chips"
            ),
        ))
    }

    /// Bandwidth per direction of a NeuronLink along `dim` (0 = X, 1 = Y: 128 GB/s; 2 = Z: 64 GB/s).
    pub fn dim_bandwidth(dim: usize) -> f64 {
        if dim < 2 {
            NEURONLINK_XY_LINK_BYTES_PER_S
        } else {
            NEURONLINK_Z_LINK_BYTES_PER_S
        }
    }

    /// Link slots per chip in [`Torus::link_id`]: two per torus dimension, then EFA egress and
    /// ingress.
    pub fn links_per_chip(&self) -> usize {
        2 * self.shape.len() + 2
    }

    /// Identifier of link `kind` leaving (or, for EFA ingress, entering) chip `chip`, dense in
    /// `0..size() * links_per_chip()`.
    pub fn link_id(&self, chip: usize, kind: LinkKind) -> usize {
        let slot = match kind {
            LinkKind::NeuronLink { dim, plus } => 2 * dim + usize::from(!plus),
            LinkKind::EfaEgress => 2 * self.shape.len(),
            LinkKind::EfaIngress => 2 * self.shape.len() + 1,
        };
        chip * self.links_per_chip() + slot
    }

    /// The chip and kind of a link identifier.
    pub fn link_of(&self, id: usize) -> (usize, LinkKind) {
        let lpc = self.links_per_chip();
        let (chip, slot) = (id / lpc, id % lpc);
        let d = self.shape.len();
        let kind = if slot < 2 * d {
            LinkKind::NeuronLink { dim: slot / 2, plus: slot % 2 == 0 }
        } else if slot == 2 * d {
            LinkKind::EfaEgress
        } else {
            LinkKind::EfaIngress
        };
        (chip, kind)
    }

    /// Bandwidth per direction of a link identifier.
    pub fn link_id_bandwidth(&self, id: usize) -> f64 {
        match self.link_of(id).1 {
            LinkKind::NeuronLink { dim, .. } => Torus::dim_bandwidth(dim),
            LinkKind::EfaEgress | LinkKind::EfaIngress => EFA_CHIP_BYTES_PER_S,
        }
    }

    /// A readable name of a link identifier, e.g. `"3->7 Y+"` or `"12 EFA out"`.
    pub fn link_name(&self, id: usize) -> String {
        let (chip, kind) = self.link_of(id);
        match kind {
            LinkKind::NeuronLink { dim, plus } => format!(
                "{chip}->{} {}{}",
                self.step(chip, dim, plus),
                DIM_NAMES[dim],
                if plus { '+' } else { '-' }
            ),
            LinkKind::EfaEgress => format!("{chip} EFA out"),
            LinkKind::EfaIngress => format!("{chip} EFA in"),
        }
    }

    /// The names of the links a transfer from chip `i` to chip `j` takes, in order
    /// (`ValueError` naming `i` or `j` for a chip that does not exist).
    pub fn route_names(&self, i: usize, j: usize) -> Result<Vec<String>> {
        self.hops(i, j)?;
        let mut names = Vec::new();
        self.route(i, j, |l| names.push(self.link_name(l)));
        Ok(names)
    }

    /// Routes a transfer from chip `src` to chip `dst`, calling `on_link` with every link it
    /// uses, in order. Chips must exist (callers check).
    pub fn route(&self, src: usize, dst: usize, mut on_link: impl FnMut(usize)) -> RouteInfo {
        if src == dst {
            return RouteInfo { hops: 0, efa: false };
        }
        if src / self.per_server != dst / self.per_server {
            on_link(self.link_id(src, LinkKind::EfaEgress));
            on_link(self.link_id(dst, LinkKind::EfaIngress));
            return RouteInfo { hops: 0, efa: true };
        }
        let mut at = src;
        let mut hops = 0;
        let mut stride = 1;
        for dim in 0..self.shape.len() {
            let e = self.shape[dim];
            let a = (src / stride) % e;
            let b = (dst / stride) % e;
            let (dist, plus) = Torus::displacement(e, a, b);
            for _ in 0..dist {
                on_link(self.link_id(at, LinkKind::NeuronLink { dim, plus }));
                at = self.step(at, dim, plus);
                hops += 1;
            }
            stride *= e;
        }
        debug_assert_eq!(at, dst);
        RouteInfo { hops, efa: false }
    }

    /// Sum of the bandwidths, per direction, of every link leaving one chip (NeuronLink, plus
    /// the EFA NIC when there are several ultraservers): the most a chip can send at once.
    pub fn chip_egress_bytes_per_s(&self) -> f64 {
        let mut total = 0.0;
        for (dim, &e) in self.shape.iter().enumerate() {
            if e >= 2 {
                total += 2.0 * Torus::dim_bandwidth(dim);
            }
        }
        if self.ultraservers > 1 {
            total += EFA_CHIP_BYTES_PER_S;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coords_and_index_round_trip() {
        let t = Torus::ultracluster(3).expect("valid");
        assert_eq!(t.size(), 192);
        assert_eq!(t.shape(), vec![4, 4, 4, 3]);
        for i in 0..t.size() {
            let c = t.coords(i).expect("exists");
            assert_eq!(t.index(&c).expect("valid"), i);
        }
        assert_eq!(t.coords(1 + 4 * 2 + 16 * 3 + 64).expect("ok"), vec![1, 2, 3, 1]);
        assert!(t.coords(192).is_err());
        assert!(t.index(&[0, 0, 4, 0]).is_err());
    }

    #[test]
    fn routes_go_the_short_way_and_count_hops() {
        let t = Torus::instance();
        // (0,0) -> (3,3): one hop back along X (wrap), one back along Y.
        assert_eq!(t.hops(0, 15).expect("ok"), 2);
        assert_eq!(t.hops(0, 2).expect("ok"), 2);
        assert_eq!(t.hops(0, 10).expect("ok"), 4);
        let mut links = Vec::new();
        t.route(0, 15, |l| links.push(t.link_name(l)));
        assert_eq!(links, vec!["0->3 X-", "3->15 Y-"]);
    }

    #[test]
    fn single_chip_has_no_links() {
        let t = Torus::single_chip();
        assert_eq!(t.size(), 1);
        assert!(t.neighbors(0).expect("ok").is_empty());
        assert_eq!(t.chip_egress_bytes_per_s(), 0.0);
        assert!(t.link_bandwidth(0, 0).is_err());
    }
}
