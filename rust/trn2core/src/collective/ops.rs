//! The vocabulary of collectives: which collective ([`Collective`]), which algorithm
//! ([`Algorithm`]) and which reduction ([`ReduceOp`]), each with the names Python lists.

named_enum! {
    /// Which collective.
    pub enum Collective("collective", value) {
        /// Every rank ends with the reduction of every rank's buffer.
        AllReduce = "all_reduce",
        /// Every rank ends with its chunk of the reduction.
        ReduceScatter = "reduce_scatter",
        /// Every rank ends with every rank's buffer, concatenated in rank order.
        AllGather = "all_gather",
        /// Rank `r` sends its chunk `j` to rank `j`.
        AllToAll = "all_to_all",
        /// Point-to-point: every rank sends its buffer to one peer (a permutation).
        SendRecv = "send_recv",
    }
}

impl Collective {
    /// Whether the collective reduces.
    pub const fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter)
    }

    /// The bus-bandwidth factor of `nccom-test` and nccl-tests for `n` ranks: all-reduce
    /// `2 (n - 1) / n`, all-gather, reduce-scatter and all-to-all `(n - 1) / n`, send/recv 1 (0 for
    /// one rank).
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => {
                (n - 1.0) / n
            }
            // One rank sends to itself: a copy in its own HBM that crosses no bus (a busbw
            // above the chip's link capacity, zero for one chip, would break the contract's
            // physics; the other collectives' factors are 0 at one rank too).
            Collective::SendRecv if n <= 1.0 => 0.0,
            Collective::SendRecv => 1.0,
        }
    }
}

named_enum! {
    /// A collective algorithm (see `docs/collectives.md`).
    pub enum Algorithm("algorithm", value) {
        /// Choose by message size as the Neuron runtime does (\[S16\]).
        Auto = "auto",
        /// One ring through every rank, run in both directions at once (the runtime's fallback;
        /// "multiple cycles with mutually exclusive wires in parallel", \[S16\]).
        Ring = "ring",
        /// The two edge-disjoint Hamiltonian cycles of the 4 x 4 torus, each run in both
        /// directions: four rings that use every X/Y link of every chip at once.
        KangaRing = "kangaring",
        /// Rings along each torus dimension in turn (X, then Y, then Z), both directions at once.
        Torus = "torus",
        /// Recursive halving (reduce-scatter) and doubling (all-gather) over the hypercube view,
        /// one channel per hypercube dimension, each walking the dimensions in a rotated order.
        Rdh = "rdh",
        /// Direct: every rank writes to every other rank in one step, routed through the torus.
        Mesh = "mesh",
        /// Within each UltraServer over NeuronLink, across UltraServers over EFA.
        Hierarchical = "hierarchical",
    }
}

named_enum! {
    /// A reduction operator.
    pub enum ReduceOp("reduction", value) {
        /// IEEE addition.
        Sum = "sum",
        /// The larger (NaN propagates; -0 orders below +0).
        Max = "max",
        /// The smaller (NaN propagates; -0 orders below +0).
        Min = "min",
    }
}
