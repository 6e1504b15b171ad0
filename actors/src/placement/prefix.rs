//! A token-id prefix tree per replica or node: the prompts routed there, as the router's guess
//! of what that cache holds (SGLang's approximate radix tree). Updated as requests are routed,
//! trimmed least-recently-used to a token budget; it never asks the replica, so it can be wrong
//! after the replica evicts, which only costs a cache miss.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const ROOT: u32 = 0;
/// The parent of a freed slot.
const FREED: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    token: u32,
    parent: u32,
    children: Vec<u32>,
    /// The tick of the last prompt that went through this node.
    last: u64,
}

#[derive(Debug, Clone)]
pub struct PrefixTree {
    /// Slot 0 is the root; freed slots are reused.
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Tokens held (nodes other than the root).
    len: usize,
    /// Most tokens held; a trim brings it back to 90% of this.
    capacity: usize,
    tick: u64,
}

impl PrefixTree {
    pub fn new(capacity: usize) -> Self {
        let root = Node { token: 0, parent: ROOT, children: Vec::new(), last: 0 };
        Self { nodes: vec![root], free: Vec::new(), len: 0, capacity: capacity.max(1), tick: 0 }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn child(&self, node: u32, token: u32) -> Option<u32> {
        self.nodes[node as usize].children.iter().copied().find(|&c| self.nodes[c as usize].token == token)
    }

    /// How many leading tokens of `tokens` the tree holds.
    pub fn match_len(&self, tokens: &[u32]) -> usize {
        let mut node = ROOT;
        for (i, &t) in tokens.iter().enumerate() {
            match self.child(node, t) {
                Some(c) => node = c,
                None => return i,
            }
        }
        tokens.len()
    }

    /// Records `tokens` as the most recently used prefix, then trims to the budget.
    pub fn insert(&mut self, tokens: &[u32]) {
        self.tick += 1;
        let mut node = ROOT;
        for &t in tokens {
            node = match self.child(node, t) {
                Some(c) => c,
                None => self.add(node, t),
            };
            self.nodes[node as usize].last = self.tick;
        }
        if self.len > self.capacity {
            self.trim(self.capacity - self.capacity / 10);
        }
    }

    fn add(&mut self, parent: u32, token: u32) -> u32 {
        let node = Node { token, parent, children: Vec::new(), last: self.tick };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.nodes[parent as usize].children.push(id);
        self.len += 1;
        id
    }

    /// Drops least recently used leaves until at most `keep` tokens remain.
    fn trim(&mut self, keep: usize) {
        let leaf = |n: &Node| n.children.is_empty();
        let mut leaves: BinaryHeap<Reverse<(u64, u32)>> = (1..self.nodes.len() as u32)
            .filter(|&i| self.nodes[i as usize].parent != FREED && leaf(&self.nodes[i as usize]))
            .map(|i| Reverse((self.nodes[i as usize].last, i)))
            .collect();
        while self.len > keep {
            let Some(Reverse((_, id))) = leaves.pop() else { break };
            let parent = self.nodes[id as usize].parent;
            self.nodes[parent as usize].children.retain(|&c| c != id);
            self.nodes[id as usize].parent = FREED;
            self.free.push(id);
            self.len -= 1;
            if parent != ROOT && leaf(&self.nodes[parent as usize]) {
                leaves.push(Reverse((self.nodes[parent as usize].last, parent)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_longest_routed_prefix() {
        let mut tree = PrefixTree::new(100);
        assert_eq!(tree.match_len(&[1, 2, 3]), 0);
        tree.insert(&[1, 2, 3, 4]);
        tree.insert(&[1, 2, 9]);
        assert_eq!(tree.len(), 5);
        assert_eq!(tree.match_len(&[1, 2, 3, 4, 5]), 4);
        assert_eq!(tree.match_len(&[1, 2, 9, 9]), 3);
        assert_eq!(tree.match_len(&[1, 7]), 1);
        assert_eq!(tree.match_len(&[2]), 0);
    }

    #[test]
    fn trims_the_least_recently_used_branches_first() {
        let mut tree = PrefixTree::new(10);
        tree.insert(&[1, 2, 3, 4, 5]); // old
        tree.insert(&[6, 7, 8, 9]); // newer
        tree.insert(&[1, 2]); // refreshes the old branch's first two tokens
        tree.insert(&[10, 11, 12]); // 12 tokens > 10: trimmed to 9
        assert!(tree.len() <= 9, "{}", tree.len());
        // The old branch's unrefreshed tail went first; the newest prompt is whole.
        assert_eq!(tree.match_len(&[1, 2, 3, 4, 5]), 2);
        assert_eq!(tree.match_len(&[10, 11, 12]), 3);
        assert_eq!(tree.match_len(&[6, 7, 8, 9]), 4);
        // Freed slots are reused.
        tree.insert(&[1, 2, 3]);
        assert_eq!(tree.match_len(&[1, 2, 3]), 3);
        assert!(tree.nodes.len() <= 13);
    }
}
