//! The order in which Triton walks a request's inputs.
//!
//! Triton keeps a request's inputs in a `std::unordered_map<std::string, Input>` and checks
//! them (batch size, datatype, shape, byte size) in that map's iteration order, stopping at
//! the first problem; its "Got input(s) [...]" list is printed in the same order. To name the
//! same input Triton would name when a request has several problems, the checker walks the
//! inputs in the order libstdc++ (GCC 11, Triton's toolchain) would iterate them: hash with
//! `std::_Hash_bytes` (64-bit MurmurHash2 variant, seed 0xc70f6907), buckets from the prime
//! rehash policy (max load factor 1), and each new node at the front of its bucket, or at
//! the front of the whole list when its bucket was empty.
//!
//! Pinned against Triton 2.51: inserting `INPUT0, INPUT1, NOPE` iterates
//! `NOPE, INPUT1, INPUT0`; `A`..`L` iterate `L, J, G, F, K, E, H, B, I, D, C, A`.

const MUL: u64 = (0xc6a4_a793_u64 << 32) + 0x5bd1_e995;
const SEED: u64 = 0xc70f_6907;

fn shift_mix(v: u64) -> u64 {
    v ^ (v >> 47)
}

/// libstdc++'s `std::hash<std::string>` on 64-bit targets (`_Hash_bytes`).
pub fn std_hash(bytes: &[u8]) -> u64 {
    let aligned = bytes.len() & !7;
    let mut hash = SEED ^ (bytes.len() as u64).wrapping_mul(MUL);
    for chunk in bytes[..aligned].chunks_exact(8) {
        let data = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let data = shift_mix(data.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = &bytes[aligned..];
    if !tail.is_empty() {
        let data = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8).wrapping_add(u64::from(b)));
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// libstdc++'s `__prime_list` (its start; maps with more inputs than this list covers are
/// not something a model has).
const PRIMES: [u64; 96] = [
    2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
    103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313,
    337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109,
    1193, 1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739,
    4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517, 8123, 8783, 9497, 10273, 11113, 12011,
    12983, 14033, 15173,
];
const FAST_BUCKETS: [u64; 14] = [2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13];

/// `_Prime_rehash_policy` with max load factor 1.
struct RehashPolicy {
    next_resize: u64,
}

impl RehashPolicy {
    fn next_bucket(&mut self, n: u64) -> u64 {
        if n < FAST_BUCKETS.len() as u64 {
            if n == 0 {
                return 1;
            }
            let buckets = FAST_BUCKETS[n as usize];
            self.next_resize = buckets;
            return buckets;
        }
        let buckets = PRIMES[6..]
            .iter()
            .copied()
            .find(|&p| p >= n)
            // Past the list: any odd number keeps the order deterministic.
            .unwrap_or(n | 1);
        self.next_resize = buckets;
        buckets
    }

    /// `_M_need_rehash(n_bkt, n_elt, 1)`: the new bucket count, if the map grows.
    fn need_rehash(&mut self, buckets: u64, elements: u64) -> Option<u64> {
        if elements < self.next_resize {
            return None;
        }
        let floor = if self.next_resize == 0 { 11 } else { 0 };
        let min_buckets = (elements + 1).max(floor);
        if min_buckets >= buckets {
            Some(self.next_bucket((min_buckets + 1).max(buckets * 2)))
        } else {
            self.next_resize = buckets;
            None
        }
    }
}

/// No node: the end of the list, or an empty bucket.
const NONE: usize = usize::MAX;
/// The list's "before begin" node, which an empty table's first bucket points at.
const BEFORE: usize = usize::MAX - 1;

/// libstdc++'s unique-key hash table, as far as iteration order goes: one singly linked list
/// of every node, and per bucket the node *before* its first one (`BEFORE` for the bucket
/// holding the list's head). Nodes are the indices of `names`.
struct Table<'n, S> {
    names: &'n [S],
    /// Each node's hash and the next node of the list.
    nodes: Vec<(u64, usize)>,
    head: usize,
    buckets: Vec<usize>,
}

impl<S: AsRef<[u8]>> Table<'_, S> {
    fn next_of(&self, node: usize) -> usize {
        if node == BEFORE {
            self.head
        } else {
            self.nodes[node].1
        }
    }

    fn set_next(&mut self, node: usize, next: usize) {
        if node == BEFORE {
            self.head = next;
        } else {
            self.nodes[node].1 = next;
        }
    }

    fn bucket(&self, node: usize) -> usize {
        (self.nodes[node].0 % self.buckets.len() as u64) as usize
    }

    /// `_M_find_before_node`: whether the node's bucket already holds its name.
    fn contains(&self, node: usize) -> bool {
        let bucket = self.bucket(node);
        if self.buckets[bucket] == NONE {
            return false;
        }
        let mut at = self.next_of(self.buckets[bucket]);
        while at != NONE && self.bucket(at) == bucket {
            if self.names[at].as_ref() == self.names[node].as_ref() {
                return true;
            }
            at = self.nodes[at].1;
        }
        false
    }

    /// `_M_insert_bucket_begin`: at the front of its bucket, or at the head of the list when
    /// its bucket is empty (the old head's bucket then starts after the new node).
    fn insert(&mut self, node: usize) {
        let bucket = self.bucket(node);
        let before = self.buckets[bucket];
        if before != NONE {
            let next = self.next_of(before);
            self.nodes[node].1 = next;
            self.set_next(before, node);
        } else {
            self.nodes[node].1 = self.head;
            self.head = node;
            let next = self.nodes[node].1;
            if next != NONE {
                let next_bucket = self.bucket(next);
                self.buckets[next_bucket] = node;
            }
            self.buckets[bucket] = BEFORE;
        }
    }

    /// `_M_rehash_aux` for unique keys: the old list walked from its head, each node put at
    /// the front of its new bucket, or at the head of the list when the bucket is new.
    fn rehash(&mut self, count: usize) {
        let mut at = std::mem::replace(&mut self.head, NONE);
        self.buckets.clear();
        self.buckets.resize(count, NONE);
        let mut head_bucket = 0;
        while at != NONE {
            let next = self.nodes[at].1;
            let bucket = self.bucket(at);
            if self.buckets[bucket] == NONE {
                self.nodes[at].1 = self.head;
                self.head = at;
                self.buckets[bucket] = BEFORE;
                if self.nodes[at].1 != NONE {
                    self.buckets[head_bucket] = at;
                }
                head_bucket = bucket;
            } else {
                let before = self.buckets[bucket];
                let after = self.next_of(before);
                self.nodes[at].1 = after;
                self.set_next(before, at);
            }
            at = next;
        }
    }
}

/// Indices of `names` in the order Triton iterates a request's inputs, each name inserted in
/// request order; a name seen before is skipped (Triton refuses it as a duplicate).
pub fn iteration_order<S: AsRef<[u8]>>(names: &[S]) -> Vec<usize> {
    let mut table = Table {
        names,
        nodes: names
            .iter()
            .map(|name| (std_hash(name.as_ref()), NONE))
            .collect(),
        head: NONE,
        buckets: vec![NONE],
    };
    let mut policy = RehashPolicy { next_resize: 0 };
    let mut count = 0;
    for node in 0..names.len() {
        if table.contains(node) {
            continue;
        }
        if let Some(grown) = policy.need_rehash(table.buckets.len() as u64, count) {
            table.rehash(grown as usize);
        }
        table.insert(node);
        count += 1;
    }
    let mut order = Vec::with_capacity(count as usize);
    let mut at = table.head;
    while at != NONE {
        order.push(at);
        at = table.nodes[at].1;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use foldhash::{HashMap, HashMapExt};

    /// An independent model of the same table, for comparison: runs of nodes that share a
    /// bucket, kept in maps and rebuilt whole on each rehash.
    /// The node list of a hash table: runs of nodes that share a bucket. The list's head is the
    /// last run; within a run the first node is the last one pushed.
    #[derive(Default)]
    struct NodeList {
        runs: Vec<Vec<usize>>,
        run_of_bucket: HashMap<u64, usize>,
    }

    impl NodeList {
        /// `_M_insert_bucket_begin`: at the front of its bucket's run, or at the head of the
        /// list in a new run.
        fn insert(&mut self, bucket: u64, node: usize) {
            match self.run_of_bucket.get(&bucket) {
                Some(&run) => self.runs[run].push(node),
                None => {
                    self.run_of_bucket.insert(bucket, self.runs.len());
                    self.runs.push(vec![node]);
                }
            }
        }

        fn iter(&self) -> impl Iterator<Item = usize> + '_ {
            self.runs
                .iter()
                .rev()
                .flat_map(|run| run.iter().rev().copied())
        }
    }

    fn reference_order<S: AsRef<[u8]>>(names: &[S]) -> Vec<usize> {
        let hashes: Vec<u64> = names.iter().map(|n| std_hash(n.as_ref())).collect();
        let mut policy = RehashPolicy { next_resize: 0 };
        let mut buckets = 1u64;
        let mut list = NodeList::default();
        let mut count = 0u64;
        let mut seen: HashMap<&[u8], ()> = HashMap::new();
        for (node, name) in names.iter().enumerate() {
            if seen.insert(name.as_ref(), ()).is_some() {
                continue;
            }
            if let Some(grown) = policy.need_rehash(buckets, count) {
                // `_M_rehash_aux` walks the old list and re-links each node exactly as an
                // insert would.
                let order: Vec<usize> = list.iter().collect();
                buckets = grown;
                list = NodeList::default();
                for old in order {
                    list.insert(hashes[old] % buckets, old);
                }
            }
            list.insert(hashes[node] % buckets, node);
            count += 1;
        }
        list.iter().collect()
    }

    fn order(names: &[&str]) -> Vec<String> {
        iteration_order(names)
            .into_iter()
            .map(|i| names[i].to_string())
            .collect()
    }

    #[test]
    fn matches_triton_2_51_as_measured() {
        assert_eq!(
            order(&["INPUT0", "INPUT1", "NOPE"]),
            ["NOPE", "INPUT1", "INPUT0"]
        );
        assert_eq!(order(&["INPUT0", "INPUT1", "X"]), ["X", "INPUT1", "INPUT0"]);
        assert_eq!(order(&["C", "A", "B"]), ["B", "A", "C"]);
        assert_eq!(
            order(&["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L"]),
            ["L", "J", "G", "F", "K", "E", "H", "B", "I", "D", "C", "A"]
        );
        // Triton reported IN_UINT32 first for a shape error in each of these five inputs.
        assert_eq!(
            order(&["IN_BOOL", "IN_UINT8", "IN_UINT16", "IN_UINT32", "IN_INT8"])[0],
            "IN_UINT32"
        );
        assert_eq!(
            order(&[
                "IN_UINT8",
                "IN_UINT16",
                "IN_UINT32",
                "IN_UINT64",
                "IN_INT8",
                "IN_INT16",
                "IN_INT64",
                "IN_FP64"
            ])[0],
            "IN_FP64"
        );
    }

    #[test]
    fn grows_past_thirteen_buckets_and_keeps_every_name_once() {
        let names: Vec<String> = (0..100).map(|i| format!("input_{i}")).collect();
        let mut seen = iteration_order(&names);
        assert_eq!(seen.len(), 100);
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert_eq!(iteration_order(&["a", "a", "b"]).len(), 2);
        assert!(iteration_order::<&str>(&[]).is_empty());
    }

    #[test]
    fn the_linked_table_orders_as_the_mapped_model() {
        // Names from a small alphabet, so that repeats and shared buckets are common.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        for _ in 0..5_000 {
            let count = next(64) as usize;
            let names: Vec<String> = (0..count).map(|_| format!("IN{}", next(40))).collect();
            assert_eq!(
                iteration_order(&names),
                reference_order(&names),
                "{names:?}"
            );
        }
    }

    #[test]
    fn hash_of_known_strings() {
        // Buckets of a 13-bucket table decide the measured orders above; pin the hash too.
        assert_eq!(std_hash(b""), shift_mix(shift_mix(SEED).wrapping_mul(MUL)));
        assert_ne!(std_hash(b"INPUT0"), std_hash(b"INPUT1"));
    }
}
